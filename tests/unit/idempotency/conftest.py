"""An app table with a guarded status column, on a SQLite file, and a clock tests move."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from jobs_platform.idempotency import Transition, claim_columns

T0 = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


class FakeClock:
    def __init__(self, now: dt.datetime = T0) -> None:
        self.now = now

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


metadata = sa.MetaData()
orders = sa.Table(
    "orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("receipt", sa.String(64), nullable=True),
    *claim_columns(),
)
SHIP = Transition(orders, from_="new", to="shipping", done="shipped")


@pytest.fixture()
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture()
def engine(tmp_path: object) -> Iterator[sa.Engine]:
    eng = sa.create_engine(f"sqlite:///{tmp_path}/app.sqlite3")
    metadata.create_all(eng)
    with eng.begin() as conn:
        conn.execute(sa.insert(orders), [{"id": i, "status": "new"} for i in (1, 2, 3)])
    yield eng
    eng.dispose()


def row(engine: sa.Engine, order_id: int = 1) -> dict[str, object]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.select(orders).where(orders.c.id == order_id)).one()._mapping)
