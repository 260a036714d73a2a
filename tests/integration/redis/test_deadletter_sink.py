"""The capture pipeline with a real Redis spool: nothing is lost while the database is down,
the hand-over is idempotent, and failures are loud (log + counter), never silent."""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from typing import Any

import pytest
import redis
import sqlalchemy.exc
from prometheus_client import REGISTRY

from jobs_platform import db
from jobs_platform.deadletter import hooks
from jobs_platform.deadletter.drainer import Drained, Drainer
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.sink import DeadLetterSink
from jobs_platform.settings import Settings
from jobs_platform.testing import dead_letter, free_port

pytestmark = pytest.mark.integration


def settings(database_url: str, redis_url: str, spool_key: str) -> Settings:
    return Settings.load(
        environ={},
        database_url=database_url,
        broker_url=redis_url,
        dlq_spool_key=spool_key,
        dlq_write_attempts=2,
    )


def dead_db_url() -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"


def letter(n: int) -> DeadLetter:
    return dead_letter(
        reason="permanent",
        task_id=f"task-{n}-{uuid.uuid4()}",
        error_type="E",
        message=f"bad {n}",
        args=[n],
        kwargs={"password": "hunter2"},
        chain="c",
    )


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture()
def spool_key() -> str:
    return f"jptest:spool:{uuid.uuid4().hex}"


def test_database_down_spools_then_drains_exactly_once(
    redis_url: str,
    redis_client: redis.Redis,
    module_pg_url: str,
    spool_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = DeadLetterSink(settings(dead_db_url(), redis_url, spool_key))
    failures_before = metric("jobs_dead_letter_write_failures_total", stage="db")
    letters = [letter(n) for n in range(5)]
    with caplog.at_level(logging.ERROR, logger="jobs_platform.deadletter"):
        for item in letters:
            assert down.capture(item) is None
    # Counted and logged loudly, and every dead letter is waiting in the spool.
    assert metric("jobs_dead_letter_write_failures_total", stage="db") == failures_before + 5
    assert sum("jobs.dlq.write_failed" in r.getMessage() for r in caplog.records) == 5
    assert redis_client.llen(spool_key) == 5
    still_down = Drainer(down).drain_quietly()  # the entries stay
    assert (still_down.moved, still_down.left) == (0, 5)
    assert isinstance(still_down.stopped_by, sqlalchemy.exc.OperationalError)

    db.upgrade(module_pg_url)
    up = DeadLetterSink(settings(module_pg_url, redis_url, spool_key))
    assert Drainer(up).drain() == Drained(moved=5)
    assert redis_client.llen(spool_key) == 0
    rows = [up.store.by_task_id(str(item.task_id)) for item in letters]
    assert [len(r) for r in rows] == [1] * 5  # count before == count after
    assert rows[0][0]["kwargs"] == {"password": "***"}  # redacted before it was spooled
    # A leftover copy (say the LREM was lost) is absorbed by the unique key.
    redis_client.rpush(spool_key, letters[0].redact(up.redact_keys).to_json())
    assert Drainer(up).drain() == Drained(moved=1)
    assert len(up.store.by_task_id(str(letters[0].task_id))) == 1


def test_capture_writes_through_and_leaves_the_spool_empty(
    redis_url: str,
    redis_client: redis.Redis,
    sqlite_url: str,
    spool_key: str,
) -> None:
    db.upgrade(sqlite_url)
    sink = DeadLetterSink(settings(sqlite_url, redis_url, spool_key))
    item = letter(1)
    before = metric(
        "jobs_dead_letters_total", task="billing.charge", queue="fast", reason="permanent"
    )
    row_id = sink.capture(item)
    assert row_id is not None
    assert sink.capture(item) is None  # reported twice, stored and counted once
    assert redis_client.llen(spool_key) == 0
    assert (
        metric("jobs_dead_letters_total", task="billing.charge", queue="fast", reason="permanent")
        == before + 1
    )


def test_spool_and_database_both_down_logs_the_whole_letter(
    sqlite_url: str,
    spool_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = DeadLetterSink(settings(dead_db_url(), f"redis://127.0.0.1:{free_port()}/0", spool_key))
    lost_before = metric("jobs_dead_letter_write_failures_total", stage="lost")
    with caplog.at_level(logging.ERROR, logger="jobs_platform.deadletter"):
        sink.capture(letter(9))
    assert metric("jobs_dead_letter_write_failures_total", stage="lost") == lost_before + 1
    [lost] = [r for r in caplog.records if "jobs.dlq.lost" in r.getMessage()]
    assert lost.levelno == logging.CRITICAL and '"task_name": "billing.charge"' in lost.getMessage()


def test_a_failing_receiver_is_logged_and_counted_not_swallowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*_: Any) -> DeadLetter:
        raise RuntimeError("bug while building the dead letter")

    app: Any = type("App", (), {})()
    before = metric("jobs_dead_letter_write_failures_total", stage="receiver")
    with caplog.at_level(logging.ERROR, logger="jobs_platform.deadletter"):
        hooks.capture(app, broken)  # must not raise into Celery
    assert metric("jobs_dead_letter_write_failures_total", stage="receiver") == before + 1
    [record] = [r for r in caplog.records if "jobs.dlq.receiver_failed" in r.getMessage()]
    assert record.exc_info is not None


def pg_sink(module_pg_url: str, redis_url: str, spool_key: str) -> DeadLetterSink:
    db.upgrade(module_pg_url)
    return DeadLetterSink(settings(module_pg_url, redis_url, spool_key))


def test_a_refused_entry_is_moved_aside_and_the_rest_of_the_spool_drains(
    redis_url: str,
    redis_client: redis.Redis,
    module_pg_url: str,
    spool_key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = pg_sink(module_pg_url, redis_url, spool_key)
    # A reason outside the CHECK constraint: PostgreSQL refuses it, today and forever.
    bad = dataclasses.replace(letter(0), reason="bogus")
    good = [letter(n) for n in range(1, 4)]
    for item in [bad, *good]:
        redis_client.rpush(spool_key, item.to_json())
    rejected_before = metric("jobs_dead_letter_write_failures_total", stage="rejected")
    with caplog.at_level(logging.ERROR, logger="jobs_platform.deadletter"):
        assert Drainer(sink).drain() == Drained(moved=3, rejected=1)
    assert [len(sink.store.by_task_id(str(i.task_id))) for i in good] == [1, 1, 1]
    assert sink.store.by_task_id(str(bad.task_id)) == []
    assert redis_client.llen(spool_key) == 0
    [kept] = redis_client.lrange(f"{spool_key}:rejected", 0, -1)
    assert json.loads(kept)["task_id"] == bad.task_id  # kept whole, for a person
    assert metric("jobs_dead_letter_write_failures_total", stage="rejected") == rejected_before + 1
    [record] = [r for r in caplog.records if r.getMessage().startswith("jobs.dlq.rejected")]
    assert record.levelno == logging.ERROR and record.event == "jobs.dlq.rejected"  # type: ignore[attr-defined]


def test_poison_values_are_made_storable_instead_of_blocking_the_spool(
    redis_url: str,
    redis_client: redis.Redis,
    module_pg_url: str,
    spool_key: str,
) -> None:
    sink = pg_sink(module_pg_url, redis_url, spool_key)
    nul = dataclasses.replace(
        letter(0),
        args=["a\u0000b", {"k\u0000": "v"}],
        headers={"x-note": "nul\u0000here"},
        errors=[{"type": "E", "message": "bad\u0000byte", "at": "t", "attempt": 1}],
        traceback="tb\u0000",
    )
    huge = dataclasses.replace(
        letter(1),
        task_name="t" * 1000,
        queue="q" * 1000,
        worker="w" * 1000,
        routing_key="r" * 300,
        content_type="c" * 300,
    )
    odd_priority = dataclasses.replace(letter(2), priority="high")  # type: ignore[arg-type]
    orphan = dataclasses.replace(letter(3), replay_of=987_654_321)  # parent purged
    items = [nul, huge, odd_priority, orphan]
    for item in items:
        redis_client.rpush(spool_key, item.to_json())
    assert Drainer(sink).drain() == Drained(moved=4)
    assert redis_client.llen(spool_key) == 0
    assert redis_client.llen(f"{spool_key}:rejected") == 0
    [row] = sink.store.by_task_id(str(nul.task_id))
    assert row["args"] == ["ab", {"k": "v"}] and row["headers"] == {"x-note": "nulhere"}
    assert row["error_message"] == "badbyte" and row["traceback"] == "tb"
    [row] = sink.store.by_task_id(str(huge.task_id))
    assert (len(row["task_name"]), len(row["queue"]), len(row["worker"])) == (255, 255, 255)
    [row] = sink.store.by_task_id(str(odd_priority.task_id))
    assert row["priority"] is None
    [row] = sink.store.by_task_id(str(orphan.task_id))
    assert row["replay_of"] is None


def test_capture_moves_a_refused_dead_letter_aside_at_once(
    redis_url: str,
    redis_client: redis.Redis,
    module_pg_url: str,
    spool_key: str,
) -> None:
    sink = pg_sink(module_pg_url, redis_url, spool_key)
    calls: list[str] = []
    add = sink.store.add

    def counting_add(item: DeadLetter) -> int | None:
        calls.append(str(item.task_id))
        return add(item)

    sink.store.add = counting_add  # type: ignore[method-assign]
    bad = dataclasses.replace(letter(0), reason="bogus")
    assert sink.capture(bad) is None
    assert len(calls) == 1  # not retried: it would fail the same way
    assert redis_client.llen(spool_key) == 0
    assert redis_client.llen(f"{spool_key}:rejected") == 1
    assert sink.capture(letter(1)) is not None  # no circuit opened by a bad row


def test_after_a_database_failure_the_process_spools_without_trying_the_database(
    redis_url: str,
    redis_client: redis.Redis,
    spool_key: str,
    module_pg_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    sink = DeadLetterSink(settings(dead_db_url(), redis_url, spool_key))
    now = [1000.0]
    sink.breaker.clock = lambda: now[0]
    calls: list[str] = []
    add = sink.store.add

    def counting_add(item: DeadLetter) -> int | None:
        calls.append(str(item.task_id))
        return add(item)

    sink.store.add = counting_add  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, logger="jobs_platform.deadletter"):
        assert sink.capture(letter(0)) is None
        assert len(calls) == 2  # dlq_write_attempts=2: the outage is detected
        for n in range(1, 6):
            assert sink.capture(letter(n)) is None
        assert len(calls) == 2  # breaker open: spooled, the database not tried
        now[0] += sink.settings.dlq_drain_interval + 0.01
        assert sink.capture(letter(6)) is None
        assert len(calls) == 3  # one probe, not a full retry
        assert sink.capture(letter(7)) is None
        assert len(calls) == 3  # open again, for twice as long
    assert redis_client.llen(spool_key) == 8  # nothing lost
    assert sum("jobs.dlq.write_failed" in r.getMessage() for r in caplog.records) == 8

    # The database is back: the probe closes the breaker, the drainer writes the rest.
    db.upgrade(module_pg_url)
    up = DeadLetterSink(settings(module_pg_url, redis_url, spool_key))
    assert Drainer(up).drain() == Drained(moved=8)
    sink.store = up.store
    now[0] += 1000
    assert sink.capture(letter(8)) is not None
    assert sink.capture(letter(9)) is not None  # closed: written through
