"""The recorder: counts buffered per series, flushed all or nothing, never lost to a failed
flush; the prometheus-client-shaped counters the platform's code uses (pure: fake Redis)."""

from __future__ import annotations

import logging
import os
import threading

import pytest
from prometheus_client import REGISTRY

from jobs_platform.metrics import counters, keys, names
from jobs_platform.metrics.counters import RecordedCounter, Recorder
from jobs_platform.testing import FakeClock, wait_for
from tests.unit.metrics.conftest import FakeClient

OK = ("celery_task_succeeded_total", ("billing.charge", "fast"))
FAILED = ("celery_task_failed_total", ("billing.charge", "fast", "ValueError"))


def recorder(client: FakeClient, interval_s: float = 3600, **kwargs: object) -> Recorder:
    return Recorder(client, interval_s=interval_s, **kwargs)  # type: ignore[arg-type]


def test_counts_are_buffered_per_series_and_written_only_by_a_flush(
    fake_redis: FakeClient,
) -> None:
    rec = recorder(fake_redis)
    for _ in range(1000):
        rec.add(OK)
    rec.add(FAILED, 2)
    assert rec.pending() == {OK: 1000.0, FAILED: 2.0}  # two series, not 1002 events
    assert fake_redis.transactions == []

    assert rec.flush()

    assert fake_redis.totals() == {OK: 1000.0, FAILED: 2.0}
    (written,) = fake_redis.transactions
    assert sorted(op[0] for op in written) == ["hincrbyfloat", "hincrbyfloat"]
    assert rec.pending() == {}
    assert rec.flush()  # nothing new: no round trip at all
    assert len(fake_redis.transactions) == 1
    rec.close()


def test_a_failed_flush_keeps_every_count_for_the_next_one(
    fake_redis: FakeClient, caplog: pytest.LogCaptureFixture
) -> None:
    rec = recorder(fake_redis)
    rec.add(OK, 3)
    fake_redis.down = True
    with caplog.at_level(logging.WARNING, logger="jobs_platform.metrics"):
        assert not rec.flush()
        rec.add(OK, 2)
        assert not rec.flush()
    # Logged once, not once per interval while Redis stays down.
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["jobs.metrics.flush_failed"]
    assert rec.pending() == {OK: 5.0}

    fake_redis.down = False
    assert rec.flush()
    assert fake_redis.totals() == {OK: 5.0}
    rec.close()


def test_the_thread_flushes_every_interval(fake_redis: FakeClient) -> None:
    rec = recorder(fake_redis, interval_s=0.05)
    rec.add(OK)
    wait_for(lambda: fake_redis.totals().get(OK) == 1.0, timeout_s=5, message="a timed flush")
    rec.add(OK)
    wait_for(lambda: fake_redis.totals().get(OK) == 2.0, timeout_s=5, message="a second flush")
    rec.close()


def test_close_flushes_what_is_left_and_stops_the_thread(fake_redis: FakeClient) -> None:
    rec = recorder(fake_redis)
    rec.add(OK, 7)
    thread = rec._thread
    assert thread is not None and thread.is_alive()
    assert rec.close()
    assert not thread.is_alive()
    assert fake_redis.totals() == {OK: 7.0}


def test_no_count_is_lost_while_threads_count_and_flush_at_once(fake_redis: FakeClient) -> None:
    rec = recorder(fake_redis)
    per_thread, threads = 20_000, 4
    counting = threading.Event()

    def count() -> None:
        for _ in range(per_thread):
            rec.add(OK)

    def flush_all_the_time() -> None:
        while counting.is_set():
            rec.flush()

    workers = [threading.Thread(target=count) for _ in range(threads)]
    counting.set()
    flusher = threading.Thread(target=flush_all_the_time)
    flusher.start()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    counting.clear()
    flusher.join()
    rec.close()
    assert fake_redis.totals() == {OK: float(per_thread * threads)}
    assert len(fake_redis.transactions) > 1  # the flushes really interleaved with counting


def test_the_main_process_reports_its_worker_alive_on_every_flush(
    fake_redis: FakeClient,
) -> None:
    clock = FakeClock(monotonic_start=1_000.0)
    rec = recorder(fake_redis, clock=clock.monotonic)
    rec.hostname = "fast@host-1"
    assert rec.flush()  # nothing counted: the heartbeat alone
    assert fake_redis.hashes[keys.WORKERS_KEY] == {"fast@host-1": "1000.0"}
    clock.advance(2.5)
    rec.flush()
    assert fake_redis.hashes[keys.WORKERS_KEY] == {"fast@host-1": "1002.5"}
    # A clean stop leaves the live list: it is not an outage.
    rec.close(farewell=True)
    assert fake_redis.hashes[keys.WORKERS_KEY] == {}
    rec.flush()  # the process's last flush at exit
    assert fake_redis.hashes[keys.WORKERS_KEY] == {}


def test_the_interval_must_be_positive(fake_redis: FakeClient) -> None:
    with pytest.raises(ValueError, match="flush interval"):
        recorder(fake_redis, interval_s=0)
    with pytest.raises(ValueError, match="flush interval"):
        counters.activate("redis://x", interval_s=-1)


def test_nothing_is_recorded_while_recording_is_off() -> None:
    assert not counters.active()
    counters.record(OK)
    assert counters.current() is None


def test_a_forked_child_starts_empty_the_parent_keeps_its_counts(recording: FakeClient) -> None:
    counters.record(OK, 5)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it would flush, leave without cleanup
        try:
            child = counters.current()
            pending = child.pending() if child is not None else None
            os.write(write, repr(pending).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        seen_in_child = pipe.read()
    os.waitpid(pid, 0)
    assert seen_in_child == "{}"  # active, but the parent's 5 are not the child's to write
    assert counters.flush()
    assert recording.totals() == {OK: 5.0}


def test_a_runtime_is_counted_in_its_bucket_with_sum_and_count(recording: FakeClient) -> None:
    labels = ("media.render", "heavy")
    for seconds in (0.3, 0.5, 700.0):
        counters.observe(names.TASK_RUNTIME, labels, seconds)
    counters.flush()
    totals = recording.totals()
    assert totals[("celery_task_runtime_bucket", (*labels, "0.5"))] == 2.0  # le is inclusive
    assert totals[("celery_task_runtime_bucket", (*labels, "+Inf"))] == 1.0
    assert totals[("celery_task_runtime_count", labels)] == 3.0
    assert totals[("celery_task_runtime_sum", labels)] == pytest.approx(700.8)


def test_fields_round_trip_and_foreign_fields_are_ignored() -> None:
    field = counters.encode_field(("x_total", ('a "quoted", value', "é")))
    assert counters.decode_field(field) == ("x_total", ('a "quoted", value', "é"))
    assert counters.decode_field(field.encode()) == ("x_total", ('a "quoted", value', "é"))
    for foreign in ("plain", "{}", "[]", "[1, 2]", b"\xff"):
        assert counters.decode_field(foreign) is None


# -- RecordedCounter ---------------------------------------------------------------------------

TEST_COUNTER = RecordedCounter(
    names.Metric(
        "jptest_recorded_total", "counter", "A counter of this test.", ("stage",), "recorded"
    )
)


def test_a_recorded_counter_counts_locally_and_for_the_exporter(recording: FakeClient) -> None:
    before = REGISTRY.get_sample_value("jptest_recorded_total", {"stage": "db"}) or 0.0
    TEST_COUNTER.labels("db").inc()
    TEST_COUNTER.labels(stage="db").inc(2)
    assert TEST_COUNTER.labels("db").value() >= 3
    assert REGISTRY.get_sample_value("jptest_recorded_total", {"stage": "db"}) == before + 3
    counters.flush()
    assert recording.totals() == {("jptest_recorded_total", ("db",)): 3.0}


def test_a_recorded_counter_refuses_what_prometheus_client_refuses(recording: FakeClient) -> None:
    with pytest.raises(ValueError, match="labels are"):
        TEST_COUNTER.labels()
    with pytest.raises(ValueError, match="labels are"):
        TEST_COUNTER.labels(stages="db")
    with pytest.raises(ValueError, match="not both"):
        TEST_COUNTER.labels("db", stage="db")
    with pytest.raises(ValueError):
        TEST_COUNTER.labels("spool").inc(-1)
    counters.flush()
    assert recording.totals() == {}  # a refused increment is not recorded either
    with pytest.raises(ValueError, match="not a counter"):
        RecordedCounter(names.QUEUE_LENGTH)


def test_the_platform_counters_are_recorded_under_the_table_names(recording: FakeClient) -> None:
    from jobs_platform.deadletter import metrics as dlq_metrics
    from jobs_platform.idempotency import events

    dlq_metrics.SPOOLED.inc()
    dlq_metrics.WRITE_FAILURES.labels("db").inc()
    dlq_metrics.DEAD_LETTERS.labels("billing.charge", "fast", "permanent").inc()
    before = events.skipped_count("billing.charge", "key")
    events.skipped("billing.charge", "key", "duplicate %s", "x")
    assert events.skipped_count("billing.charge", "key") == before + 1
    counters.flush()
    assert recording.totals() == {
        ("jobs_dead_letter_spooled_total", ()): 1.0,
        ("jobs_dead_letter_write_failures_total", ("db",)): 1.0,
        ("jobs_dead_letters_total", ("billing.charge", "fast", "permanent")): 1.0,
        ("jobs_duplicates_skipped_total", ("billing.charge", "key")): 1.0,
    }
    for counter in (dlq_metrics.DEAD_LETTERS, events.DUPLICATES_SKIPPED):
        assert names.BY_NAME[counter.metric.name] is counter.metric


def test_activating_another_target_flushes_and_replaces_the_recorder(
    recording: FakeClient,
) -> None:
    counters.record(OK, 2)
    first = counters.current()
    counters.activate("redis://fake", interval_s=3600, client=recording)  # same: kept
    assert counters.current() is first

    elsewhere = FakeClient()
    counters.activate("redis://elsewhere", interval_s=3600, client=elsewhere)
    assert recording.totals() == {OK: 2.0}  # the old target got its counts
    counters.record(OK)
    assert counters.current() is not first
    assert counters.deactivate()
    assert elsewhere.totals() == {OK: 1.0}
    assert not counters.active()
