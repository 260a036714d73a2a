"""The batch counting transaction on the real databases: each member's outcome counted once
(racing duplicate recordings in threads included), dead -> succeeded on a replay, each
callback written to the outbox once, by the transition that settles the batch."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import sqlalchemy as sa
from kombu.utils.json import loads

from jobs_platform import history
from jobs_platform.batches import counting, state
from jobs_platform.batches.model import batches, members
from jobs_platform.clock import utcnow
from jobs_platform.db import engine_for, statement_engine_for, upgrade
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.outbox.model import job_outbox

pytestmark = pytest.mark.integration

CALLBACKS = {
    name: {"task": f"cb.{name}", "payload": '[["B"], {}]', "options": "{}"}
    for name in counting.CALLBACKS
}


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    with engine_for(url).begin() as conn:
        for table in (job_outbox, members, batches):
            conn.execute(sa.delete(table))
    return url


def make(url: str, total: int, batch_id: str = "b1") -> str:
    with engine_for(url).begin() as conn:
        counting.create(conn, batch_id, "test", total, CALLBACKS)
    return batch_id


def record(url: str, batch_id: str, member: str, outcome: str) -> counting.Change | None:
    with engine_for(url).begin() as conn:
        return counting.record(conn, batch_id, member, outcome)


def row(url: str, batch_id: str = "b1") -> Any:
    with engine_for(url).connect() as conn:
        return conn.execute(sa.select(batches).where(batches.c.id == batch_id)).one()


def callbacks_sent(url: str) -> list[str]:
    with engine_for(url).connect() as conn:
        return sorted(r.task_name for r in conn.execute(sa.select(job_outbox)))


def test_each_member_counts_once_and_the_settling_one_enqueues_the_callbacks(db_url: str) -> None:
    make(db_url, 3)
    assert record(db_url, "b1", "m1", "succeeded") is not None
    assert record(db_url, "b1", "m1", "succeeded") is None  # a redelivery: no change
    assert record(db_url, "b1", "m2", "succeeded") is not None
    assert callbacks_sent(db_url) == []
    change = record(db_url, "b1", "m3", "succeeded")
    assert change is not None and set(change.enqueued) == {"on_complete", "on_success"}
    assert record(db_url, "b1", "m3", "succeeded") is None
    b = row(db_url)
    assert (b.total, b.pending, b.succeeded, b.dead, b.cancelled) == (3, 0, 3, 0, 0)
    assert callbacks_sent(db_url) == ["cb.on_complete", "cb.on_success"]
    with engine_for(db_url).connect() as conn:
        payloads = [loads(r.payload) for r in conn.execute(sa.select(job_outbox))]
    assert payloads == [[["B"], {}]] * 2


def test_racing_duplicate_recordings_count_once(db_url: str) -> None:
    n, threads = 60, 6
    make(db_url, n)
    changes: list[Any] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def run(alone: bool) -> None:
        start.wait()
        for i in range(n):
            outcome = "succeeded" if i % 3 else "dead"
            if alone:  # the worker's way: one statement, else the full transaction
                change = counting.record_alone(db_url, "b1", f"m{i}", outcome)
            else:
                change = record(db_url, "b1", f"m{i}", outcome)
            if change is not None:
                with lock:
                    changes.append(change)

    workers = [threading.Thread(target=run, args=(k % 2 == 0,)) for k in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert len(changes) == n  # each member's outcome written by exactly one thread
    b = row(db_url)
    assert (b.pending, b.succeeded, b.dead) == (0, 40, 20)
    assert callbacks_sent(db_url) == ["cb.on_complete", "cb.on_failure"]  # no on_success


def test_the_one_statement_recording_applies_only_where_it_settles_nothing(
    db_url: str,
) -> None:
    make(db_url, 3)
    make(db_url, 2, "b2")
    engine = engine_for(db_url)

    def plain(batch_id: str, member: str, outcome: str) -> counting.Change | None:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            return counting.record_plain(conn, batch_id, member, outcome)

    if db_url.startswith("sqlite"):
        assert plain("b1", "m1", "succeeded") is None  # PostgreSQL only: record() decides
        return
    change = plain("b1", "m1", "succeeded")
    assert change is not None and (change.before, change.pending, change.succeeded) == (
        "pending",
        2,
        1,
    )
    assert plain("b1", "m1", "succeeded") is None  # a duplicate: nothing written
    assert plain("b1", "m2", "dead") is None  # the first death enqueues on_failure
    assert record(db_url, "b1", "m2", "dead") is not None
    assert plain("b1", "m3", "succeeded") is None  # the last member settles the batch
    assert plain("gone", "m1", "succeeded") is None
    with engine.begin() as conn:
        counting.add_members(conn, "b2", [("added", "t")])
    assert plain("b2", "added", "succeeded") is None  # an added member has a pending row
    b = row(db_url)
    assert (b.pending, b.succeeded, b.dead) == (1, 1, 1)
    assert callbacks_sent(db_url) == ["cb.on_failure"]


def test_the_worker_recording_survives_a_pooled_connection_that_died(db_url: str) -> None:
    if db_url.startswith("sqlite"):
        pytest.skip("PostgreSQL's statement engine (no ping at checkout)")
    make(db_url, 3)
    assert counting.record_alone(db_url, "b1", "m1", "succeeded") is not None
    with statement_engine_for(db_url).connect() as conn:
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
    with engine_for(db_url).connect() as conn:  # the server drops the pooled connection
        conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    change = counting.record_alone(db_url, "b1", "m2", "succeeded")
    assert change is not None and change.pending == 1
    assert counting.record_alone(db_url, "b1", "m2", "succeeded") is None
    assert row(db_url).succeeded == 2


def test_a_replayed_dead_member_moves_to_succeeded_and_the_last_one_fires_on_success(
    db_url: str,
) -> None:
    make(db_url, 3)
    record(db_url, "b1", "m1", "succeeded")
    record(db_url, "b1", "m2", "dead")
    record(db_url, "b1", "m3", "dead")
    assert callbacks_sent(db_url) == ["cb.on_complete", "cb.on_failure"]
    assert record(db_url, "b1", "m2", "cancelled") is None  # a dead member is not cancelled
    change = record(db_url, "b1", "m2", "succeeded")
    assert change is not None and change.before == "dead" and change.enqueued == ()
    assert record(db_url, "b1", "m2", "succeeded") is None
    change = record(db_url, "b1", "m3", "succeeded")
    assert change is not None and change.enqueued == ("on_success",)
    b = row(db_url)
    assert (b.pending, b.succeeded, b.dead) == (0, 3, 0)
    assert callbacks_sent(db_url) == ["cb.on_complete", "cb.on_failure", "cb.on_success"]


def test_cancelled_members_settle_the_batch_without_success(db_url: str) -> None:
    make(db_url, 2)
    with engine_for(db_url).begin() as conn:
        assert counting.cancel(conn, "b1", "stop")
        assert not counting.cancel(conn, "b1", "again")  # the first cancel stays
        assert counting.is_cancelled(conn, "b1")
    record(db_url, "b1", "m1", "succeeded")  # it was running: it finishes
    record(db_url, "b1", "m2", "cancelled")
    assert callbacks_sent(db_url) == ["cb.on_complete"]
    assert row(db_url).cancel_reason == "stop"


def test_added_members_count_once_and_hold_the_batch_open(db_url: str) -> None:
    make(db_url, 1)
    with engine_for(db_url).begin() as conn:
        assert counting.add_members(conn, "b1", [("c1", "t"), ("c2", "t")]) == 2
    with engine_for(db_url).begin() as conn:  # the adding member ran again
        assert counting.add_members(conn, "b1", [("c1", "t"), ("c2", "t")]) == 0
    record(db_url, "b1", "m1", "succeeded")
    record(db_url, "b1", "c1", "succeeded")
    assert callbacks_sent(db_url) == []
    record(db_url, "b1", "c2", "succeeded")
    b = row(db_url)
    assert (b.total, b.pending, b.succeeded) == (3, 0, 3)
    assert callbacks_sent(db_url) == ["cb.on_complete", "cb.on_success"]


def test_an_empty_batch_settles_at_creation(db_url: str) -> None:
    make(db_url, 0)
    assert callbacks_sent(db_url) == ["cb.on_complete", "cb.on_success"]


def test_an_outcome_for_a_batch_that_is_gone_writes_nothing(db_url: str) -> None:
    """A late duplicate, or a dead member replayed after its batch was pruned: no count to
    move, and no stray member row left behind (prune only removes members of the batches it
    deletes)."""
    assert record(db_url, "gone", "m1", "succeeded") is None
    with engine_for(db_url).connect() as conn:
        left = conn.execute(sa.select(members.c.member_id).where(members.c.batch_id == "gone"))
        assert left.all() == []


def letter(task_id: str, headers: dict[str, Any]) -> DeadLetter:
    return DeadLetter(
        task_id=task_id,
        task_name="t.member",
        queue="default",
        reason="exhausted",
        args=[],
        kwargs={},
        headers=headers,
        errors=[{"type": "x.Boom", "message": "boom", "attempt": 1}],
        failed_at=utcnow(),
        chain="chain-" + task_id,
    )


def test_the_dead_letter_store_counts_a_member_dead_once_and_links_its_letter(
    db_url: str,
) -> None:
    make(db_url, 2)
    store = DeadLetterStore(db_url)
    dead = letter("m1", {history.BATCH_HEADER: "b1"})
    row_id = store.add(dead)
    assert row_id is not None
    assert store.add(dead) is None  # the same chain reported twice: stored and counted once
    b = row(db_url)
    assert (b.pending, b.dead) == (1, 1)
    # A replay (new task id) that dies again is the same member: no second count.
    again = letter("r1", {history.BATCH_HEADER: "b1", history.BATCH_MEMBER_HEADER: "m1"})
    assert store.add(again) is not None
    assert row(db_url).dead == 1
    shown = state.get(None, "b1", engine=engine_for(db_url))
    assert shown is not None and shown.dead_letters == {"m1": row_id}
    assert shown.status == "running"


def test_prune_deletes_settled_batches_past_retention(db_url: str) -> None:
    make(db_url, 1, "old")
    make(db_url, 1, "open")
    record(db_url, "old", "m", "succeeded")
    engine = engine_for(db_url)
    assert state.prune(engine, retention_s=3600) == 0
    assert state.prune(engine, retention_s=0) == 1
    with engine.connect() as conn:
        assert [r.id for r in conn.execute(sa.select(batches))] == ["open"]
        assert conn.execute(sa.select(sa.func.count()).select_from(members)).scalar() == 0
