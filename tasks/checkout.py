"""Checkout: an order and its charge committed together (``delay_on_commit``).

``place_order`` writes the order and its invoice and dispatches the charge
(``tasks.billing.charge_invoice``) in **one database transaction**: the charge is a row of
the platform's outbox written in that transaction, which a worker's relay publishes once
the transaction has committed. So:

- an order rolled back (the checkout failed after the charge was dispatched: a stock
  check, a fraud rule, a crash before the commit) never charges: its charge never existed;
- an order committed is charged, even if the web process dies the instant after its
  commit (``--kill-after-commit`` SIGKILLs it there): the relay publishes the charge with
  the task id ``place_order`` returned, and the charge's status CAS and Idempotency-Key
  make it one charge whatever is delivered twice.

The orders live in the platform's database (``JOBS_DATABASE_URL``): ``delay_on_commit``
refuses a session on any other. From the command line (what ``make demo`` runs)::

    python -m tasks.checkout --email ada@example.com --amount 1990 [--abandon | --kill-after-commit]

prints one JSON line (order, invoice, the charge's task id, whether it committed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys

import sqlalchemy as sa
from sqlalchemy.orm import Session

from tasks import billing

metadata = sa.MetaData()

#: One row per order placed at the checkout, with the invoice its charge pays.
orders = sa.Table(
    "checkout_orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("customer_email", sa.String(254), nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("invoice_id", sa.Integer, nullable=False),
)


class CheckoutAbandoned(Exception):
    """The checkout failed after the charge was dispatched (the demo's stand-in for a
    failed stock check): the transaction rolls back, and the charge with it."""


@dataclasses.dataclass(frozen=True)
class Placed:
    order_id: int
    invoice_id: int
    charge_task_id: str
    committed: bool


def create_schema(engine: sa.Engine) -> None:
    billing.create_schema(engine)
    metadata.create_all(engine)


def place_order(customer_email: str, amount_cents: int, *, abandon: bool = False) -> Placed:
    """The order, its invoice and its charge, committed together (or, ``abandon``, not at
    all: the checkout fails after the charge was dispatched and the transaction rolls back)."""
    engine = billing.billing_engine()
    create_schema(engine)
    try:
        with Session(engine) as session, session.begin():  # commits, or rolls back on error
            values = {"customer_email": customer_email, "amount_cents": amount_cents}
            invoice = session.execute(
                sa.insert(billing.invoices).values(**values, currency="EUR", status="open")
            )
            invoice_id = int(invoice.inserted_primary_key[0])
            order = session.execute(sa.insert(orders).values(**values, invoice_id=invoice_id))
            order_id = int(order.inserted_primary_key[0])
            charge = billing.charge_invoice.delay_on_commit(session, invoice_id)
            if abandon:
                raise CheckoutAbandoned(f"order {order_id}: out of stock")
    except CheckoutAbandoned:
        return Placed(order_id, invoice_id, charge.id, committed=False)
    return Placed(order_id, invoice_id, charge.id, committed=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.checkout", description=__doc__)
    parser.add_argument("--email", required=True)
    parser.add_argument("--amount", type=int, required=True, help="cents")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--abandon", action="store_true", help="roll the order back")
    mode.add_argument(
        "--kill-after-commit", action="store_true", help="SIGKILL this process right after"
    )
    options = parser.parse_args(argv)
    placed = place_order(options.email, options.amount, abandon=options.abandon)
    print(json.dumps(dataclasses.asdict(placed)), flush=True)
    if options.kill_after_commit:
        # Dies here, as a web process killed by a deploy would: nothing after the commit
        # runs, not even interpreter shutdown. The charge must happen anyway.
        os.kill(os.getpid(), signal.SIGKILL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
