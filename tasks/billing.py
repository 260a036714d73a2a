"""thirdparty + fast queues: charge an invoice exactly once, email its receipt exactly once.

This is the way to write a side-effecting task (see docs/side-effects.md):

1. The charge is guarded by a status compare-and-swap on the invoice row
   (``open -> charging -> paid``), committed before the gateway is called: a duplicate
   delivery, a racing worker or a replay finds the row taken or paid and returns.
2. The gateway call carries the task's stable ``idempotency_key`` (derived from the
   invoice id, not from the message), which covers the one window the CAS cannot: a
   worker that dies after the gateway charged but before ``paid`` was written. The
   redelivered job re-claims the expired claim and calls again; the gateway answers
   with the first charge.
3. The receipt mailer dedupes nothing, so the email goes through the platform's
   idempotency-key table: a duplicate gets the recorded send back.

Every run of the charge task that finds the invoice paid enqueues the email (cheap,
deduped), so a crash between ``paid`` and the enqueue cannot lose the receipt.
The building blocks are importable so tests can register the tasks on a test app.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from jobs_platform import (
    IdempotencyKeys,
    PermanentError,
    ReliableTask,
    Settings,
    Transition,
    claim_columns,
    transition,
)
from jobs_platform.db import engine_for
from tasks.gateway import GatewayClient
from tasks.jobs import app

metadata = sa.MetaData()

#: The reference app's own table (its schema, created with ``create_schema``).
invoices = sa.Table(
    "invoices",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer_email", sa.String(254), nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("charge_id", sa.String(64), nullable=True),
    *claim_columns(),
)

#: open -> charging (claimed, gateway call in flight) -> paid.
CHARGE = Transition(invoices, from_="open", to="charging", done="paid")


def database_url() -> str:
    """The billing database: ``BILLING_DATABASE_URL``, else the platform's database."""
    return (
        os.environ.get("BILLING_DATABASE_URL")
        or os.environ.get("JOBS_DATABASE_URL")
        or Settings().database_url
    )


def billing_engine() -> sa.Engine:
    return engine_for(database_url())


def gateway() -> GatewayClient:
    return GatewayClient(os.environ.get("BILLING_GATEWAY_URL", "http://127.0.0.1:8766"))


def create_schema(engine: sa.Engine) -> None:
    metadata.create_all(engine)


def create_invoice(
    engine: sa.Engine, *, customer_email: str, amount_cents: int, currency: str = "EUR"
) -> int:
    with engine.begin() as conn:
        result = conn.execute(
            sa.insert(invoices).values(
                customer_email=customer_email,
                amount_cents=amount_cents,
                currency=currency,
                status="open",
            )
        )
        return int(result.inserted_primary_key[0])


def load_invoice(engine: sa.Engine, invoice_id: int) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(invoices).where(invoices.c.id == invoice_id)).first()
    return None if row is None else dict(row._mapping)


@dataclasses.dataclass(frozen=True)
class Hooks:
    """Test seams: called before the claim, and right after the gateway answered."""

    before_claim: Callable[[int], None] | None = None
    after_charge: Callable[[int, dict[str, Any]], None] | None = None


@dataclasses.dataclass(frozen=True)
class BillingTasks:
    charge_invoice: Any
    send_invoice_email: Any


def register(target: Any, *, hooks: Hooks | None = None, **options: Any) -> BillingTasks:
    """Declare the billing tasks on ``target`` (``options`` override the task options)."""
    hooks = hooks or Hooks()

    @transition(
        CHARGE,
        id_arg="invoice_id",
        engine=billing_engine,
        done_values=lambda charge: {"charge_id": charge["id"]},
    )
    def charge_once(task: Any, invoice_id: int) -> dict[str, Any]:
        invoice = load_invoice(billing_engine(), invoice_id)
        assert invoice is not None  # the claim succeeded, so the row exists
        charge = gateway().charge(
            amount_cents=invoice["amount_cents"],
            currency=invoice["currency"],
            reference=f"invoice-{invoice_id}",
            idempotency_key=task.idempotency_key,
        )
        if hooks.after_charge is not None:
            hooks.after_charge(invoice_id, charge)
        return charge

    @target.task(
        **{
            "base": ReliableTask,
            "bind": True,
            "name": "tasks.billing.charge_invoice",
            "queue": "thirdparty",
            "business_key": ("invoice_id",),
            "unique_for": 300,
            **options,
        }
    )
    def charge_invoice(self: Any, invoice_id: int) -> dict[str, Any] | None:
        if hooks.before_claim is not None:
            hooks.before_claim(invoice_id)
        charge = charge_once(self, invoice_id)  # None: a duplicate, nothing charged
        invoice = load_invoice(billing_engine(), invoice_id)
        if invoice is not None and invoice["status"] == "paid":
            send_invoice_email.delay(invoice_id)
        return charge

    @target.task(
        **{
            "base": ReliableTask,
            "bind": True,
            "name": "tasks.billing.send_invoice_email",
            "queue": "fast",
            "business_key": ("invoice_id",),
            "unique_for": 300,
            **options,
        }
    )
    def send_invoice_email(self: Any, invoice_id: int) -> dict[str, Any]:
        invoice = load_invoice(billing_engine(), invoice_id)
        if invoice is None or invoice["status"] != "paid":
            raise PermanentError(f"invoice {invoice_id} is not paid; no receipt to send")

        def send() -> dict[str, Any]:
            return gateway().send_email(
                to=invoice["customer_email"],
                subject=f"Receipt for invoice {invoice_id}",
                body=f"We charged {invoice['amount_cents'] / 100:.2f} {invoice['currency']} "
                f"({invoice['charge_id']}).",
            )

        keys = IdempotencyKeys.for_app(self.app)
        return keys.run_once(self.idempotency_key, send, task=self.name)

    return BillingTasks(charge_invoice, send_invoice_email)


_tasks = register(app)
charge_invoice = _tasks.charge_invoice
send_invoice_email = _tasks.send_invoice_email


def replay_demo(*, gateway_url: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Charge one invoice three ways (dispatch, duplicate, replay); report what was charged.

    Needs the reference workers (thirdparty and fast) running with ``BILLING_GATEWAY_URL``
    set to ``gateway_url``, and the platform migrations applied to the database.
    """
    engine = billing_engine()
    create_schema(engine)
    invoice_id = create_invoice(engine, customer_email="ada@example.com", amount_cents=4200)
    first = charge_invoice.delay(invoice_id)
    duplicate = charge_invoice.delay(invoice_id)  # unique dispatch: the same task id
    first.get(timeout=timeout_s)
    # A replay bypasses every enqueue-time guard: the same message sent again.
    replay = app.send_task(charge_invoice.name, args=[invoice_id])
    replayed = replay.get(timeout=timeout_s)
    client = GatewayClient(gateway_url)
    reference = f"invoice-{invoice_id}"
    deadline = time.monotonic() + timeout_s
    while not any(e["subject"].endswith(f" {invoice_id}") for e in client.list("emails")):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return {
        "invoice_id": invoice_id,
        "status": (load_invoice(engine, invoice_id) or {}).get("status"),
        "same_task_id_on_duplicate_dispatch": duplicate.id == first.id,
        "replay_result": replayed,  # None: recognised as a duplicate, nothing charged
        "gateway_charges": sum(c["reference"] == reference for c in client.list("charges")),
        "receipts_sent": sum(
            e["subject"].endswith(f" {invoice_id}") for e in client.list("emails")
        ),
    }
