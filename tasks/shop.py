"""The shop: order intake, the warehouse, the stock refresh and the end-of-day export.

These are the tasks ``make demo`` runs as a shop's workload (docs/demo.md):

- ``accept_order(order_id, customer_id, amount)`` (fast): an order as the checkout form sent
  it. The amount is parsed here; one that is not a whole number of cents raises
  ``ValueError``, which the classifier fails at once (a dead letter with its reason, no
  retries). The order row and its invoice are written in one transaction keyed by the order
  id, so a redelivered order makes no second invoice; then the invoice is charged
  (``tasks.billing.charge_invoice``: status CAS + the gateway's idempotency key) and the
  stock reserved.
- ``reserve_stock(order_id)`` (thirdparty): the warehouse API takes 5 calls a second from
  all of us together, so the task declares ``rate_limit="5/s"``: one limit shared by every
  worker through the broker's Redis (docs/task-options.md). The reservation file is named
  after the order, so running it again rewrites it.
- ``sync_stock()`` (fast): refreshes the stock levels. Beat runs it every second when
  ``SHOP_STOCK_SYNC_EVERY_S`` is set (the demo sets it; nothing else should run every
  second). Each run appends its slot to ``stock/sync-runs.log``, so runs per slot can be
  counted.
- ``export_orders()`` (heavy): the orders and their invoices' status as CSV.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from jobs_platform import ConfigError, ReliableTask
from jobs_platform.clock import utcnow
from jobs_platform.db import insert_ignoring
from jobs_platform.schedule import SLOT_HEADER
from tasks import billing, schedule
from tasks.jobs import app
from tasks.paths import atomic_write, data_dir

#: The warehouse API's limit, for every worker together.
WAREHOUSE_RATE = "5/s"
#: Beat runs ``sync_stock`` every this many seconds when set (unset: not scheduled).
STOCK_SYNC_ENV = "SHOP_STOCK_SYNC_EVERY_S"
STOCK_SYNC_ENTRY = "shop-stock-sync"

metadata = sa.MetaData()

#: One row per accepted order, written with its invoice in one transaction.
orders = sa.Table(
    "shop_orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("customer_id", sa.Integer, nullable=False),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("invoice_id", sa.Integer, nullable=False),
)


def create_schema(engine: sa.Engine) -> None:
    """The shop's tables and the billing tables it writes to."""
    billing.create_schema(engine)
    metadata.create_all(engine)


def parse_cents(amount: Any) -> int:
    """The amount as the checkout sent it ("1990"), in cents; ValueError if it is not one."""
    try:
        cents = int(str(amount).strip())
    except ValueError:
        raise ValueError(f"order amount {amount!r} is not a whole number of cents") from None
    if cents <= 0:
        raise ValueError(f"order amount must be a positive number of cents, got {cents}")
    return cents


def record_order(engine: sa.Engine, order_id: int, customer_id: int, amount_cents: int) -> int:
    """The order's invoice id, creating order and invoice on the first delivery only."""
    with engine.begin() as conn:
        # The order row goes first: a redelivery's insert is ignored, and it reads the
        # invoice the first delivery wrote (same transaction, so never one without the other).
        taken = conn.execute(
            insert_ignoring(
                conn,
                orders,
                {
                    "id": order_id,
                    "customer_id": customer_id,
                    "amount_cents": amount_cents,
                    "invoice_id": 0,
                },
                unique=["id"],
            )
        )
        if taken.rowcount == 1:
            created = conn.execute(
                sa.insert(billing.invoices).values(
                    customer_email=f"customer{customer_id}@example.com",
                    amount_cents=amount_cents,
                    currency="EUR",
                    status="open",
                )
            ).inserted_primary_key
            assert created is not None
            invoice_id = created[0]
            conn.execute(
                sa.update(orders).where(orders.c.id == order_id).values(invoice_id=invoice_id)
            )
            return int(invoice_id)
        return int(
            conn.execute(sa.select(orders.c.invoice_id).where(orders.c.id == order_id)).scalar_one()
        )


@app.task(base=ReliableTask, bind=True, name="tasks.shop.accept_order", queue="fast")
def accept_order(self: Any, order_id: int, customer_id: int, amount: str) -> dict[str, Any]:
    cents = parse_cents(amount)  # before any write: a malformed order leaves nothing behind
    invoice_id = record_order(billing.billing_engine(), order_id, customer_id, cents)
    charge = billing.charge_invoice.delay(invoice_id)  # unique dispatch: once per invoice
    reservation = reserve_stock.delay(order_id)
    return {"invoice_id": invoice_id, "charge_task": charge.id, "reserve_task": reservation.id}


@app.task(
    base=ReliableTask,
    bind=True,
    name="tasks.shop.reserve_stock",
    queue="thirdparty",
    rate_limit=WAREHOUSE_RATE,
)
def reserve_stock(self: Any, order_id: int) -> float:
    """Returns when it started (Unix time), so the demo can count starts per second."""
    started = time.time()
    path = data_dir() / "stock" / "reservations" / f"order-{order_id}.json"
    atomic_write(path, json.dumps({"order_id": order_id, "at": started}).encode())
    return started


def sync_runs_log() -> Path:
    return data_dir() / "stock" / "sync-runs.log"


@app.task(base=ReliableTask, bind=True, name="tasks.shop.sync_stock", queue="fast")
def sync_stock(self: Any) -> str | None:
    slot = (self.request.headers or {}).get(SLOT_HEADER)
    reservations = data_dir() / "stock" / "reservations"
    reserved = len(list(reservations.glob("*.json"))) if reservations.is_dir() else 0
    levels = {"as_of": utcnow().isoformat(), "slot": slot, "reserved_orders": reserved}
    atomic_write(data_dir() / "stock" / "levels.json", json.dumps(levels).encode())
    # One short line per run, appended (O_APPEND keeps concurrent lines whole).
    log = sync_runs_log()
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(f"{slot or '-'} {self.request.id}\n")
    return slot


@app.task(base=ReliableTask, bind=True, name="tasks.shop.export_orders", queue="heavy")
def export_orders(self: Any) -> dict[str, Any]:
    engine = billing.billing_engine()
    invoices = billing.invoices
    query = (
        sa.select(orders.c.id, orders.c.customer_id, orders.c.amount_cents, invoices.c.status)
        .join(invoices, invoices.c.id == orders.c.invoice_id)
        .order_by(orders.c.id)
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(["order_id", "customer_id", "amount_cents", "invoice_status"])
    writer.writerows(rows)
    path = data_dir() / "exports" / f"orders-{utcnow().date().isoformat()}.csv"
    atomic_write(path, text.getvalue().encode())
    return {"path": str(path), "rows": len(rows)}


def stock_sync_entry(every_s: float) -> dict[str, Any]:
    """The beat entry: a missed refresh is not worth sending late (``catch_up=0``), and
    runs are independent of each other (``overlap="allow"``)."""
    return {
        "task": sync_stock.name,
        "schedule": every_s,
        "options": {"overlap": "allow", "catch_up": 0},
    }


def _stock_sync_every() -> float | None:
    raw = os.environ.get(STOCK_SYNC_ENV, "").strip()
    if not raw:
        return None
    try:
        every = float(raw)
    except ValueError:
        every = 0.0
    if every <= 0:
        raise ConfigError(f"{STOCK_SYNC_ENV} must be a number of seconds > 0, got {raw!r}")
    return every


_every = _stock_sync_every()
if _every is not None:
    # tasks.schedule set the app's schedule when it was imported (above); add to it.
    app.conf.beat_schedule = {
        **schedule.BEAT_SCHEDULE,
        STOCK_SYNC_ENTRY: stock_sync_entry(_every),
    }
