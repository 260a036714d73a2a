"""Tables with leased claims on a SQLite file, and a clock tests move.

``orders`` is an app table guarded by a status CAS; ``leases`` gives the leased-claim
primitive other column names, so nothing in it may assume the CAS's or the key table's.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from jobs_platform.idempotency import Transition, claim_columns
from jobs_platform.idempotency.claim import LeasedClaims

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

leases = sa.Table(
    "leases",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("phase", sa.String(16), nullable=False),
    sa.Column("holder", sa.String(200), nullable=True),
    sa.Column("until", sa.DateTime(timezone=True), nullable=True),
    sa.Column("note", sa.String(64), nullable=True),
)
LEASES = LeasedClaims(
    leases,
    held="busy",
    id_column="name",
    state_column="phase",
    owner_column="holder",
    expires_column="until",
)
#: What "free" means for ``leases`` (for the CAS it is a status in ``from_``).
IDLE = leases.c.phase == "idle"


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
