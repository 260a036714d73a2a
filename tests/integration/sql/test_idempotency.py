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
from jobs_platform.idempotency import Claim, IdempotencyKeys
from tests.unit.idempotency.conftest import IDLE, LEASES, SHIP, leases, metadata, orders

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


# The leased claim itself, under both guards above: same races, other column names.


def new_lease(url: str, phase: str, **values: Any) -> str:
    name = uuid.uuid4().hex
    with engine_for(url).begin() as conn:
        conn.execute(sa.insert(leases).values(name=name, phase=phase, **values))
    return name


def take(url: str, name: str, owner: str, **kw: Any) -> Any:
    with engine_for(url).begin() as conn:
        return LEASES.take(conn, name, free=IDLE, owner=owner, lease_s=30, now=now(), **kw)


def holder(url: str, name: str) -> str | None:
    with engine_for(url).connect() as conn:
        return conn.execute(sa.select(leases.c.holder).where(leases.c.name == name)).scalar()


@pytest.mark.parametrize("held", [False, True], ids=["free", "lease-ran-out"])
def test_racing_takes_have_exactly_one_winner(db_url: str, held: bool) -> None:
    stale = {"holder": "crashed", "until": now() - dt.timedelta(seconds=1)}
    name = new_lease(db_url, "busy", **stale) if held else new_lease(db_url, "idle")
    results = race(RACERS, lambda i: take(db_url, name, f"w{i}"))
    assert not [r for r in results if isinstance(r, BaseException)]
    winners = [r for r in results if isinstance(r, Claim)]
    assert len(winners) == 1
    assert holder(db_url, name) == winners[0].owner


def test_racing_inserts_have_exactly_one_winner(db_url: str) -> None:
    name = uuid.uuid4().hex

    def insert(i: int) -> Any:
        with engine_for(db_url).begin() as conn:
            return LEASES.insert(conn, name, owner=f"w{i}", lease_s=30, now=now(), values={})

    results = race(RACERS, insert)
    assert not [r for r in results if isinstance(r, BaseException)]
    winners = [r for r in results if isinstance(r, Claim)]
    assert len(winners) == 1
    assert holder(db_url, name) == winners[0].owner


def test_the_same_job_prefix_is_matched_literally(db_url: str) -> None:
    # LIKE escaping differs between dialects: "_" and "%" must match only themselves.
    name = new_lease(db_url, "busy", holder="jobX1/h:1/a", until=now() + dt.timedelta(seconds=60))
    assert take(db_url, name, "job_1/h:2/b", same_job="job_1/") is None
    assert take(db_url, name, "%/h:2/b", same_job="%/") is None
    assert take(db_url, name, "jobX1/h:2/b", same_job="jobX1/") is not None


def test_only_the_holder_settles_or_drops(db_url: str) -> None:
    name = new_lease(db_url, "idle")
    assert take(db_url, name, "w1") is not None
    with engine_for(db_url).begin() as conn:
        assert not LEASES.settle(conn, name, "w2", {"note": "stolen"})
        assert not LEASES.drop(conn, name, "w2")
        assert LEASES.settle(conn, name, "w1", {"note": "mine"})
        assert LEASES.drop(conn, name, "w1")
    assert holder(db_url, name) is None
