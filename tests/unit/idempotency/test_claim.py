"""The leased claim under both database guards, on SQLite (races on PostgreSQL: integration)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from jobs_platform.idempotency.claim import Claim
from tests.unit.idempotency.conftest import IDLE, LEASES, T0, FakeClock, leases


def put(engine: sa.Engine, name: str, phase: str, **values: Any) -> None:
    with engine.begin() as conn:
        conn.execute(sa.insert(leases).values(name=name, phase=phase, **values))


def lease_row(engine: sa.Engine, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(leases).where(leases.c.name == name)).first()
    if row is None:
        return None
    found = dict(row._mapping)
    # SQLite hands back naive datetimes; they are UTC.
    if found["until"] is not None:
        found["until"] = found["until"].replace(tzinfo=dt.UTC)
    return found


def take(engine: sa.Engine, name: str, owner: str, now: dt.datetime, **kw: Any) -> Claim | None:
    with engine.begin() as conn:
        return LEASES.take(conn, name, free=IDLE, owner=owner, lease_s=30, now=now, **kw)


def test_take_claims_a_free_row_with_its_values(engine: sa.Engine, clock: FakeClock) -> None:
    put(engine, "a", "idle")
    claim = take(engine, "a", "w1", clock(), values={"note": "first"})
    assert claim is not None
    assert (claim.row_id, claim.owner, claim.expires_at) == (
        "a",
        "w1",
        T0 + dt.timedelta(seconds=30),
    )
    assert lease_row(engine, "a") == {
        "name": "a",
        "phase": "busy",
        "holder": "w1",
        "until": T0 + dt.timedelta(seconds=30),
        "note": "first",
    }


def test_a_live_claim_holds_until_its_lease_has_run_out(
    engine: sa.Engine, clock: FakeClock
) -> None:
    put(engine, "a", "idle")
    assert take(engine, "a", "w1", clock()) is not None
    assert take(engine, "a", "w2", clock()) is None
    clock.advance(30)  # the lease ends at this instant: still held
    assert take(engine, "a", "w2", clock()) is None
    clock.advance(0.001)
    assert take(engine, "a", "w2", clock()) is not None
    assert lease_row(engine, "a")["holder"] == "w2"  # type: ignore[index]


def test_a_held_row_without_expiry_counts_as_abandoned(engine: sa.Engine, clock: FakeClock) -> None:
    put(engine, "a", "busy", holder="ghost", until=None)
    assert take(engine, "a", "w1", clock()) is not None


def test_the_same_jobs_later_attempt_takes_over_at_once_and_the_prefix_is_literal(
    engine: sa.Engine, clock: FakeClock
) -> None:
    put(engine, "a", "busy", holder="jobX1/h:1/a", until=T0 + dt.timedelta(seconds=30))
    # "_" and "%" would be LIKE wildcards: neither may match another job's claim.
    assert take(engine, "a", "job_1/h:2/b", clock(), same_job="job_1/") is None
    assert take(engine, "a", "%/h:2/b", clock(), same_job="%/") is None
    assert take(engine, "a", "jobX2/h:2/b", clock(), same_job="jobX2/") is None
    assert take(engine, "a", "jobX1/h:2/b", clock(), same_job="jobX1/") is not None


@pytest.mark.parametrize("phase", ["done", "elsewhere"])
def test_a_row_neither_free_nor_held_is_not_taken(
    engine: sa.Engine, clock: FakeClock, phase: str
) -> None:
    put(engine, "a", phase)
    assert take(engine, "a", "w1", clock(), same_job="w1") is None
    assert lease_row(engine, "a")["phase"] == phase  # type: ignore[index]


def test_a_missing_row_is_not_taken(engine: sa.Engine, clock: FakeClock) -> None:
    assert take(engine, "nope", "w1", clock()) is None
    assert lease_row(engine, "nope") is None


def test_insert_creates_the_row_claimed_once(engine: sa.Engine, clock: FakeClock) -> None:
    with engine.begin() as conn:
        first = LEASES.insert(
            conn, "new", owner="w1", lease_s=30, now=clock(), values={"note": "n"}
        )
        second = LEASES.insert(conn, "new", owner="w2", lease_s=30, now=clock(), values={})
    assert first is not None and first.owner == "w1"
    assert second is None
    assert lease_row(engine, "new") == {
        "name": "new",
        "phase": "busy",
        "holder": "w1",
        "until": T0 + dt.timedelta(seconds=30),
        "note": "n",
    }


def test_settle_writes_only_for_the_holder(engine: sa.Engine, clock: FakeClock) -> None:
    put(engine, "a", "idle")
    claim = take(engine, "a", "w1", clock())
    assert claim is not None
    done = {"phase": "done", "holder": None, "until": None, "note": "ok"}
    with engine.begin() as conn:
        assert not LEASES.settle(conn, "a", "w2", done)
        assert not LEASES.settle(conn, "a", None, done)
        assert LEASES.settle(conn, "a", "w1", done)
        # No longer held: a second settle by the former holder changes nothing.
        assert not LEASES.settle(conn, "a", "w1", {"note": "again"})
    assert lease_row(engine, "a")["note"] == "ok"  # type: ignore[index]


def test_a_claimant_overtaken_after_its_lease_can_neither_settle_nor_drop(
    engine: sa.Engine, clock: FakeClock
) -> None:
    put(engine, "a", "idle")
    stale = take(engine, "a", "w1", clock())
    clock.advance(31)
    assert take(engine, "a", "w2", clock()) is not None
    with engine.begin() as conn:
        assert not LEASES.settle(conn, "a", "w1", {"phase": "idle"})
        assert not LEASES.drop(conn, "a", "w1")
    assert stale is not None
    assert lease_row(engine, "a")["holder"] == "w2"  # type: ignore[index]


def test_drop_deletes_only_for_the_holder(engine: sa.Engine, clock: FakeClock) -> None:
    put(engine, "a", "idle")
    assert take(engine, "a", "w1", clock()) is not None
    with engine.begin() as conn:
        assert not LEASES.drop(conn, "a", "w2")
        assert LEASES.drop(conn, "a", "w1")
        assert not LEASES.drop(conn, "a", "w1")
    assert lease_row(engine, "a") is None


def test_a_rolled_back_transaction_takes_nothing(engine: sa.Engine, clock: FakeClock) -> None:
    # Every step runs on the caller's connection: the key table claims inside one
    # transaction with its insert, so the claim must commit or roll back with it.
    put(engine, "a", "idle")
    with pytest.raises(RuntimeError), engine.begin() as conn:
        assert LEASES.take(conn, "a", free=IDLE, owner="w1", lease_s=30, now=clock())
        raise RuntimeError("rollback")
    assert lease_row(engine, "a")["phase"] == "idle"  # type: ignore[index]
