"""The status compare-and-swap, in process on SQLite (races on PostgreSQL: integration)."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from jobs_platform.errors import ConfigError, LostRace, PermanentError, SkipTransition
from jobs_platform.idempotency import Transition, claim_columns, events, transition
from tests.unit.idempotency.conftest import SHIP, FakeClock, orders, row


def guarded(
    engine: sa.Engine,
    clock: FakeClock,
    calls: list[Any],
    *,
    fail: bool = False,
    lease_s: float = 30.0,
) -> Any:
    @transition(
        SHIP,
        id_arg="order_id",
        engine=lambda: engine,
        lease_s=lease_s,
        clock=clock,
        done_values=lambda result: {"receipt": result},
    )
    def ship(order_id: int) -> str:
        # The claim is committed before the side effect: another connection sees it.
        calls.append(row(engine, order_id)["status"])
        if fail:
            raise ConnectionError("carrier unreachable")
        return f"r-{order_id}"

    return ship


def test_first_delivery_claims_commits_runs_and_writes_done(
    engine: sa.Engine, clock: FakeClock
) -> None:
    calls: list[Any] = []
    assert guarded(engine, clock, calls)(1) == "r-1"
    assert calls == ["shipping"]
    assert row(engine) == {
        "id": 1,
        "status": "shipped",
        "receipt": "r-1",
        "claimed_by": None,
        "claim_expires_at": None,
    }


def test_duplicate_after_done_is_skipped_and_counted(engine: sa.Engine, clock: FakeClock) -> None:
    calls: list[Any] = []
    ship = guarded(engine, clock, calls)
    ship(1)
    before = events.skipped_count(
        "tests.unit.idempotency.test_transition.guarded.<locals>.ship", "transition"
    )
    assert ship(1) is None
    assert calls == ["shipping"]  # the side effect ran once
    after = events.skipped_count(
        "tests.unit.idempotency.test_transition.guarded.<locals>.ship", "transition"
    )
    assert after == before + 1


def test_exception_releases_the_claim_and_propagates(engine: sa.Engine, clock: FakeClock) -> None:
    calls: list[Any] = []
    with pytest.raises(ConnectionError):
        guarded(engine, clock, calls, fail=True)(1)
    assert row(engine)["status"] == "new"
    assert row(engine)["claimed_by"] is None
    assert guarded(engine, clock, calls)(1) == "r-1"  # the retry claims again
    assert calls == ["shipping", "shipping"]


def test_live_claim_loses_the_race_and_expired_one_is_taken_over(
    engine: sa.Engine, clock: FakeClock
) -> None:
    first = SHIP.claim(engine, 1, owner="a", lease_s=30, now=clock())
    with pytest.raises(LostRace):
        SHIP.claim(engine, 1, owner="b", lease_s=30, now=clock())
    clock.advance(30.001)
    second = SHIP.claim(engine, 1, owner="b", lease_s=30, now=clock())
    assert row(engine)["claimed_by"] == "b"
    # The stale claimant can neither finish nor release a claim it lost.
    assert not SHIP.finish(engine, first, {"receipt": "stale"})
    assert not SHIP.release(engine, first)
    assert SHIP.finish(engine, second, {"receipt": "r"})
    assert row(engine)["status"] == "shipped"
    with pytest.raises(SkipTransition) as skip:
        SHIP.claim(engine, 1, owner="c", lease_s=30, now=clock())
    assert skip.value.status == "shipped" and not isinstance(skip.value, LostRace)


def test_lease_lost_before_done_returns_the_result_and_leaves_the_row_to_the_new_owner(
    engine: sa.Engine, clock: FakeClock
) -> None:
    @transition(SHIP, id_arg="order_id", engine=lambda: engine, lease_s=10, clock=clock)
    def slow(order_id: int) -> str:
        clock.advance(11)
        SHIP.claim(engine, order_id, owner="other", lease_s=10, now=clock())
        return "done anyway"

    assert slow(2) == "done anyway"
    assert row(engine, 2)["status"] == "shipping" and row(engine, 2)["claimed_by"] == "other"


def test_missing_row_is_a_permanent_error(engine: sa.Engine, clock: FakeClock) -> None:
    with pytest.raises(PermanentError, match="no row id=99"):
        guarded(engine, clock, [])(99)


def test_a_task_keeps_its_signature_for_celerys_argument_check(
    engine: sa.Engine, clock: FakeClock
) -> None:
    import inspect

    ship = guarded(engine, clock, [])
    assert list(inspect.signature(ship).parameters) == ["order_id"]
    assert ship.__name__ == "ship"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"from_": "new", "to": "new", "done": "x"}, "distinct"),
        ({"from_": (), "to": "a", "done": "b"}, "distinct"),
        ({"from_": "new", "to": "a", "done": "a"}, "distinct"),
        ({"from_": "new", "to": "a", "done": "b", "release_to": "a"}, "release_to"),
        ({"from_": "new", "to": "a", "done": "b", "status_column": "state"}, "no column 'state'"),
    ],
)
def test_bad_transitions_are_refused_at_declaration(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Transition(orders, **kwargs)


def test_a_table_without_claim_columns_is_refused() -> None:
    bare = sa.Table(
        "bare",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("status", sa.String(8)),
    )
    with pytest.raises(ConfigError, match="claim_columns"):
        Transition(bare, from_="a", to="b", done="c")
    assert [c.name for c in claim_columns("o", "e")] == ["o", "e"]


def test_id_arg_must_name_a_parameter(engine: sa.Engine) -> None:
    with pytest.raises(ConfigError, match="'order'"):

        @transition(SHIP, id_arg="order", engine=lambda: engine)
        def ship(order_id: int) -> None: ...


def test_no_lease_outside_a_task_without_lease_s(engine: sa.Engine) -> None:
    @transition(SHIP, id_arg="order_id", engine=lambda: engine)
    def ship(order_id: int) -> None: ...

    with pytest.raises(ConfigError, match="lease"):
        ship(1)
    assert row(engine)["status"] == "new"


def test_a_later_attempt_of_the_same_job_takes_over_its_dead_predecessors_claim(
    engine: sa.Engine, clock: FakeClock
) -> None:
    # A pool child died holding the claim and Celery retried the job at once: same task id.
    SHIP.claim(engine, 1, owner="job-1/host:10/a", lease_s=30, now=clock())
    with pytest.raises(LostRace):  # another job must still wait for the lease
        SHIP.claim(engine, 1, owner="job-2/host:11/b", lease_s=30, now=clock(), same_job="job-2/")
    with pytest.raises(LostRace):  # the prefix is matched literally ("_" is no wildcard)
        SHIP.claim(engine, 1, owner="job_1/host:12/c", lease_s=30, now=clock(), same_job="job_1/")
    retry = SHIP.claim(
        engine, 1, owner="job-1/host:12/c", lease_s=30, now=clock(), same_job="job-1/"
    )
    assert row(engine)["claimed_by"] == retry.owner
