"""The capture pipeline with a real Redis spool: nothing is lost while the database is down,
the hand-over is idempotent, and failures are loud (log + counter), never silent."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

import pytest
import redis
from prometheus_client import REGISTRY

from jobs_platform import db
from jobs_platform.deadletter import receiver
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.sink import DeadLetterSink
from jobs_platform.settings import Settings
from jobs_platform.testing import free_port

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
    return DeadLetter(
        reason="permanent",
        task_id=f"task-{n}-{uuid.uuid4()}",
        task_name="billing.charge",
        queue="fast",
        errors=[{"type": "E", "message": f"bad {n}", "at": "t", "attempt": 1}],
        failed_at=dt.datetime.now(dt.UTC),
        args=[n],
        kwargs={"password": "hunter2"},
        attempts=1,
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
    assert down.drain_quietly() == 0  # still down: the entries stay

    db.upgrade(module_pg_url)
    up = DeadLetterSink(settings(module_pg_url, redis_url, spool_key))
    assert up.drain() == 5
    assert redis_client.llen(spool_key) == 0
    rows = [up.store.by_task_id(str(item.task_id)) for item in letters]
    assert [len(r) for r in rows] == [1] * 5  # count before == count after
    assert rows[0][0]["kwargs"] == {"password": "***"}  # redacted before it was spooled
    # A leftover copy (say the LREM was lost) is absorbed by the unique key.
    redis_client.rpush(spool_key, letters[0].redact(up.redact_keys).to_json())
    assert up.drain() == 1
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
        receiver.capture(app, broken)  # must not raise into Celery
    assert metric("jobs_dead_letter_write_failures_total", stage="receiver") == before + 1
    [record] = [r for r in caplog.records if "jobs.dlq.receiver_failed" in r.getMessage()]
    assert record.exc_info is not None
