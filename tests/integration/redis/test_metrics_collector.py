"""The exporter's collector against a real Redis (a private redis-server, so every key is
this module's) and real databases: its text parsed with prometheus-client's parser."""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import time
import types
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from jobs_platform import ReliableTask, create_app
from jobs_platform import db as platform_db
from jobs_platform.brokers.redis.layout import UNSCANNED, BrokerLayout, read_inflight
from jobs_platform.brokers.redis.options import keys_for
from jobs_platform.cli.metrics import metrics as metrics_command
from jobs_platform.clock import utc_iso
from jobs_platform.deadletter.model import REASONS
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.exporter import server as exporter
from jobs_platform.exporter.collector import WORKER_RETENTION_S, JobsCollector
from jobs_platform.exporter.sources import Sources
from jobs_platform.metrics import keys, names
from jobs_platform.metrics.counters import BUCKET_LABELS, Recorder
from jobs_platform.schedule.state import SKIPPED_KEY, TICKS_KEY
from jobs_platform.testing import RedisServer, dead_letter, free_port
from tests.support.metrics_app import family_names, samples, value

pytestmark = pytest.mark.integration

NOW = 1_900_000_000.0  # the collector's clock in these tests


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture()
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_server.url)
    conn.flushdb()
    yield conn
    conn.close()


@pytest.fixture()
def app(redis_server: RedisServer, sqlite_url: str, client: redis.Redis) -> Any:
    platform_db.upgrade(sqlite_url)
    app = create_app("metricstest", broker_url=redis_server.url, database_url=sqlite_url)

    @app.task(base=ReliableTask, name="m.fast", queue="fast")
    def on_fast(n: int) -> None: ...

    @app.task(base=ReliableTask, name="m.heavy", queue="heavy")
    def on_heavy(n: int) -> None: ...

    app.jobs_test_tasks = {"fast": on_fast, "heavy": on_heavy}
    return app


def scrape(app: Any, *, now: float = NOW, **changes: Any) -> dict[Any, float]:
    sources = dataclasses.replace(Sources.from_app(app), **changes)
    registry = CollectorRegistry()
    registry.register(JobsCollector(sources, clock=lambda: now))
    return samples(generate_latest(registry).decode())


def stamped(seconds_ago: float) -> dict[str, str]:
    moment = dt.datetime.fromtimestamp(NOW - seconds_ago, dt.UTC)
    return {"jobs_enqueued_at": utc_iso(moment)}


def test_queue_length_counts_every_priority_sublist_and_the_oldest_stamp_wins(
    app: Any, client: redis.Redis
) -> None:
    fast, heavy = app.jobs_test_tasks["fast"], app.jobs_test_tasks["heavy"]
    for n in range(3):
        fast.apply_async((n,), headers=stamped(10))
    for n in range(2):
        fast.apply_async((n,), priority=6, headers=stamped(120 - n))  # the oldest: 120 s
    fast.apply_async((9,), priority=9, headers=stamped(30))
    heavy.apply_async((1,), headers=stamped(45))
    assert client.llen("fast") == 3  # what a plain LLEN sees (celery-exporter#272)

    got = scrape(app)

    assert value(got, "celery_queue_length", queue_name="fast") == 6
    assert value(got, "celery_queue_length", queue_name="heavy") == 1
    assert value(got, "celery_queue_length", queue_name="thirdparty") == 0
    assert value(got, "jobs_queue_oldest_age_seconds", queue_name="fast") == pytest.approx(120)
    assert value(got, "jobs_queue_oldest_age_seconds", queue_name="heavy") == pytest.approx(45)
    assert value(got, "jobs_queue_oldest_age_seconds", queue_name="thirdparty") == 0


def test_a_queue_whose_messages_carry_no_stamp_has_a_depth_but_no_age(
    app: Any, client: redis.Redis
) -> None:
    app.send_task("m.fast", (1,), queue="fast")  # not through ReliableTask: no stamp
    got = scrape(app)
    assert value(got, "celery_queue_length", queue_name="fast") == 1
    assert value(got, "jobs_queue_oldest_age_seconds", queue_name="fast") is None


def test_messages_fetched_and_not_acknowledged_are_in_flight_per_queue(
    app: Any, client: redis.Redis
) -> None:
    fast, heavy = app.jobs_test_tasks["fast"], app.jobs_test_tasks["heavy"]
    for n in range(3):
        fast.delay(n)
    heavy.delay(1)
    with app.connection_for_read() as conn:
        # kombu itself records what it hands out unacknowledged: unacked + unacked_index.
        channel = conn.default_channel
        held = [channel.basic_get(queue, no_ack=False) for queue in ("fast", "fast", "heavy")]
        fetched_at = time.time()
        assert client.hlen("unacked") == 3

        got = scrape(app, now=fetched_at + 50)

        assert value(got, "jobs_inflight", queue_name="fast") == 2
        assert value(got, "jobs_inflight", queue_name="heavy") == 1
        assert value(got, "jobs_inflight", queue_name="thirdparty") == 0
        assert value(got, "celery_queue_length", queue_name="fast") == 1
        age = value(got, "jobs_inflight_oldest_age_seconds", queue_name="fast")
        assert age is not None and 50 <= age < 55
        assert value(got, "jobs_inflight_oldest_age_seconds", queue_name="thirdparty") == 0

        # Past the scan limit the rest is still counted, under one label.
        partial = read_inflight(client, BrokerLayout.from_app(app), limit=2)
        assert partial.total == 3 and sum(partial.by_queue.values()) == 3
        assert partial.by_queue[UNSCANNED] == 1
        for message in held:
            message.ack()


def test_counts_from_several_processes_are_summed_and_the_histogram_is_cumulative(
    app: Any, client: redis.Redis
) -> None:
    labels = ("m.fast", "fast")
    for seconds in ((0.001, 0.3), (0.3, 20.0)):  # two pool processes
        recorder = Recorder(redis.Redis.from_url(app.conf.broker_url), interval_s=60)
        recorder.add(("celery_task_succeeded_total", labels), 2)
        recorder.add(("jobs_dead_letter_spooled_total", ()), 1)
        for s in seconds:
            edge = BUCKET_LABELS[bisect.bisect_left(names.RUNTIME_BUCKETS, s)]
            recorder.add(("celery_task_runtime_bucket", (*labels, edge)))
            recorder.add(("celery_task_runtime_sum", labels), s)
            recorder.add(("celery_task_runtime_count", labels))
        assert recorder.close()
    client.hset(keys.COUNTERS_KEY, "not json", 5)  # foreign fields are ignored
    client.hset(keys.COUNTERS_KEY, '["celery_task_succeeded_total","one label"]', 5)

    got = scrape(app)

    assert value(got, "celery_task_succeeded_total", name="m.fast", queue_name="fast") == 4
    assert value(got, "jobs_dead_letter_spooled_total") == 2
    bucket = {
        le: value(got, "celery_task_runtime_bucket", name="m.fast", queue_name="fast", le=le)
        for le in ("0.005", "0.25", "0.5", "10.0", "30.0", "+Inf")
    }
    assert bucket == {"0.005": 1, "0.25": 1, "0.5": 3, "10.0": 3, "30.0": 4, "+Inf": 4}
    assert value(got, "celery_task_runtime_count", name="m.fast", queue_name="fast") == 4
    assert value(got, "celery_task_runtime_sum", name="m.fast", queue_name="fast") == pytest.approx(
        20.601
    )


def test_a_worker_is_up_while_it_reports_in_then_down_then_forgotten(
    app: Any, client: redis.Redis
) -> None:
    recorder = Recorder(client, interval_s=60, clock=lambda: NOW)
    recorder.hostname = "fast@host-1"
    assert recorder.flush()
    late_s = Sources.from_app(app).worker_late_s

    assert value(scrape(app, now=NOW + 1), "celery_worker_up", hostname="fast@host-1") == 1
    assert value(scrape(app, now=NOW + late_s + 1), "celery_worker_up", hostname="fast@host-1") == 0
    gone = scrape(app, now=NOW + WORKER_RETENTION_S + 1)
    assert value(gone, "celery_worker_up", hostname="fast@host-1") is None
    assert client.hlen(keys.WORKERS_KEY) == 0  # pruned, so the hash never grows for good


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_dead_letters_by_status_and_reason_and_the_newest_age(
    app: Any, database: str, request: pytest.FixtureRequest
) -> None:
    url = app.jobs_settings.database_url
    if database == "postgresql":
        url = request.getfixturevalue("module_pg_url")
        platform_db.upgrade(url)
    store = DeadLetterStore(url)
    with store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM dead_letter_jobs"))
    failed = dt.datetime.fromtimestamp(NOW, dt.UTC)
    ids = [
        store.add(dead_letter(reason="permanent", failed_at=failed - dt.timedelta(seconds=s)))
        for s in (30, 600, 900)
    ]
    store.add(dead_letter(reason="exhausted", failed_at=failed - dt.timedelta(seconds=3600)))
    store.discard([i for i in ids[2:] if i is not None], reason="INC-1 fixed", actor="test")

    got = scrape(app, database_url=url)

    assert value(got, "jobs_dead_letters_stored", status="dead", reason="permanent") == 2
    assert value(got, "jobs_dead_letters_stored", status="discarded", reason="permanent") == 1
    assert value(got, "jobs_dead_letters_stored", status="dead", reason="exhausted") == 1
    assert value(got, "jobs_dead_letters_stored", status="replayed", reason="poison") == 0
    stored = [k for k in got if k[0] == "jobs_dead_letters_stored"]
    # every status x reason: no series appears from nowhere
    assert len(stored) == 3 * len(REASONS)
    assert value(got, "jobs_dead_letter_newest_age_seconds") == pytest.approx(30, abs=0.01)


def test_spool_delayed_store_and_beat_ticks(app: Any, client: redis.Redis) -> None:
    spool = app.jobs_settings.dlq_spool_key
    client.rpush(spool, "a", "b")
    client.rpush(f"{spool}:rejected", "c")
    due = keys_for(app).due
    client.zadd(due, {"job-1": (NOW + 120) * 1000, "job-2": (NOW + 60) * 1000})  # ms
    ticks, skipped = TICKS_KEY, SKIPPED_KEY
    client.hset(skipped, mapping={"overlap:nightly-report": 2, "missed:nightly-report": 1})
    client.hset(
        ticks,
        mapping={
            "nightly-report": utc_iso(dt.datetime.fromtimestamp(NOW - 5, dt.UTC)),
            "broken": "not a time",
        },
    )

    got = scrape(app)

    assert value(got, "jobs_dead_letter_spool_depth", list="spool") == 2
    assert value(got, "jobs_dead_letter_spool_depth", list="rejected") == 1
    assert value(got, "jobs_dead_letter_spool_depth", list="unreadable") == 0
    assert value(got, "jobs_delayed_depth") == 2
    assert value(got, "jobs_delayed_next_due_timestamp_seconds") == pytest.approx(NOW + 60)
    assert value(
        got, "jobs_beat_last_tick_timestamp_seconds", entry="nightly-report"
    ) == pytest.approx(NOW - 5)
    assert value(got, "jobs_beat_last_tick_timestamp_seconds", entry="broken") is None

    assert value(got, "jobs_beat_skipped_total", entry="nightly-report", reason="overlap") == 2

    client.delete(due)
    empty = scrape(app)
    assert value(empty, "jobs_delayed_depth") == 0
    assert value(empty, "jobs_delayed_next_due_timestamp_seconds") is None


def test_a_source_that_cannot_be_read_is_reported_and_the_rest_is_served(
    app: Any, tmp_path: Any
) -> None:
    no_db = scrape(app, database_url=f"sqlite:///{tmp_path}/missing/none.sqlite3")
    assert value(no_db, "jobs_exporter_source_up", source="database") == 0
    assert value(no_db, "jobs_exporter_source_up", source="redis") == 1
    assert value(no_db, "celery_queue_length", queue_name="fast") == 0
    assert not [k for k in no_db if k[0] == "jobs_dead_letters_stored"]

    no_redis = scrape(app, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    assert value(no_redis, "jobs_exporter_source_up", source="redis") == 0
    assert value(no_redis, "jobs_exporter_source_up", source="database") == 1
    assert value(no_redis, "celery_queue_length", queue_name="fast") is None
    assert value(no_redis, "jobs_dead_letters_stored", status="dead", reason="poison") == 0


def test_every_metric_of_the_table_is_served_and_nothing_else(
    app: Any, client: redis.Redis
) -> None:
    text = exporter.exposition(app)
    assert family_names(text) == {metric.family for metric in names.ALL}


def test_the_server_and_the_command(app: Any) -> None:
    port = free_port()
    server = exporter.serve(app, host="127.0.0.1", port=port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            served = samples(answer.read().decode())
        assert value(served, "jobs_exporter_source_up", source="redis") == 1

        # The command refuses a taken port with a clear message, and --once prints a scrape.
        obj = types.SimpleNamespace(app=app)
        taken = CliRunner().invoke(metrics_command, ["--port", str(port)], obj=obj)
        assert taken.exit_code == 1 and f"cannot listen on 127.0.0.1:{port}" in taken.output
    finally:
        server.shutdown()
        server.server_close()
    once = CliRunner().invoke(metrics_command, ["--once"], obj=types.SimpleNamespace(app=app))
    assert once.exit_code == 0, once.output
    assert value(samples(once.output), "celery_queue_length", queue_name="heavy") == 0
