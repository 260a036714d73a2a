"""Races on the real databases: many threads, one winner (PostgreSQL and SQLite)."""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from jobs_platform.db import engine_for, upgrade
from jobs_platform.errors import LostRace
from jobs_platform.idempotency import IdempotencyKeys
from tests.unit.idempotency.conftest import SHIP, metadata, orders

pytestmark = pytest.mark.integration

T = TypeVar("T")
RACERS = 8


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)  # idempotent: applies 0001 + 0002 once
    metadata.create_all(engine_for(url))
    return url


def race(n: int, attempt: Callable[[int], T]) -> list[T | BaseException]:
    """Run ``attempt(i)`` in ``n`` threads released together; results or exceptions."""
    barrier = threading.Barrier(n)
    results: list[T | BaseException] = [RuntimeError("not run")] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = attempt(i)
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def new_order(url: str, **values: Any) -> int:
    order_id = uuid.uuid4().int % 2_000_000_000
    with engine_for(url).begin() as conn:
        conn.execute(sa.insert(orders).values(id=order_id, **{"status": "new", **values}))
    return order_id


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def test_racing_claims_on_one_row_have_one_winner(db_url: str) -> None:
    order_id = new_order(db_url)
    engine = engine_for(db_url)
    results = race(
        RACERS, lambda i: SHIP.claim(engine, order_id, owner=f"w{i}", lease_s=30, now=now())
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    assert all(isinstance(r, LostRace) for r in results if r not in winners)


def test_an_expired_lease_is_reclaimed_by_exactly_one_of_the_racers(db_url: str) -> None:
    order_id = new_order(
        db_url,
        status="shipping",
        claimed_by="crashed-worker",
        claim_expires_at=now() - dt.timedelta(seconds=1),
    )
    engine = engine_for(db_url)
    results = race(
        RACERS, lambda i: SHIP.claim(engine, order_id, owner=f"w{i}", lease_s=30, now=now())
    )
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(winners) == 1
    with engine.connect() as conn:
        owner = conn.execute(sa.select(orders.c.claimed_by).where(orders.c.id == order_id)).one()
    assert owner[0] == winners[0].owner  # type: ignore[union-attr]


def test_racing_key_claims_have_one_winner_and_the_rest_see_its_result(db_url: str) -> None:
    keys = IdempotencyKeys(db_url, ttl_s=3600)
    key = f"race:{uuid.uuid4().hex}"
    results = race(RACERS, lambda i: keys.claim(key, task="t", lease_s=30, owner=f"w{i}"))
    outcomes = sorted(r.outcome for r in results if not isinstance(r, BaseException))
    assert outcomes == ["busy"] * (RACERS - 1) + ["claimed"]
    winner = next(r for r in results if not isinstance(r, BaseException) and r.claimed)
    assert keys.record(winner, {"sent": True})  # type: ignore[union-attr]
    assert keys.claim(key, task="t", lease_s=30).result == {"sent": True}


def test_an_expired_key_lease_is_taken_over_by_exactly_one_racer(db_url: str) -> None:
    past = now() - dt.timedelta(seconds=60)
    keys = IdempotencyKeys(db_url, ttl_s=3600, clock=lambda: past)
    key = f"stale:{uuid.uuid4().hex}"
    assert keys.claim(key, task="t", lease_s=1, owner="crashed").claimed
    keys = IdempotencyKeys(db_url, ttl_s=3600)
    results = race(RACERS, lambda i: keys.claim(key, task="t", lease_s=30, owner=f"w{i}"))
    outcomes = sorted(r.outcome for r in results if not isinstance(r, BaseException))
    assert outcomes == ["busy"] * (RACERS - 1) + ["claimed"]
