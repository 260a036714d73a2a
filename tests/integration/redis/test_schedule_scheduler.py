"""The beat Scheduler in-process on the real Redis broker, its time driven by a FakeClock:
which slots it publishes, once, under two beats, a failover, downtime and overlaps.

Real ``celery beat`` processes do the same in tests/acceptance/test_beat.py.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu.exceptions import OperationalError

from jobs_platform import ReliableTask, create_app
from jobs_platform.errors import ConfigError
from jobs_platform.schedule import running
from jobs_platform.schedule.scheduler import Scheduler
from jobs_platform.schedule.slots import ENTRY_HEADER, SLOT_HEADER, parse_slot
from jobs_platform.testing import FakeClock

pytestmark = pytest.mark.integration

START = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.UTC)


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    # Entry names are global on a broker (their progress is shared): start each test afresh.
    for key in conn.scan_iter(match="jobs:beat:*"):
        conn.delete(key)
    yield conn
    # Nothing consumes here: drop what the schedulers published.
    for key in conn.scan_iter(match="fast*"):
        conn.delete(key)
    conn.close()


@pytest.fixture()
def app(redis_url: str, tmp_path: Any) -> Any:
    app = create_app(
        f"beatint-{uuid.uuid4().hex[:6]}",
        broker_url=redis_url,
        database_url=f"sqlite:///{tmp_path}/jobs.sqlite3",
    )

    @app.task(base=ReliableTask, name="beatint.job", queue="fast", time_limit=10)
    def job(n: int = 0) -> None: ...

    return app


def every(seconds: float, **options: Any) -> dict[str, Any]:
    return {
        "task": "beatint.job",
        "schedule": dt.timedelta(seconds=seconds),
        "options": options,
    }


def beat(app: Any, entries: dict[str, Any], clock: FakeClock, sender: str) -> Scheduler:
    app.conf.beat_schedule = entries
    return Scheduler(app=app, clock=clock.now, sender_id=sender)


def published(client: redis.Redis, entry: str) -> list[dict[str, Any]]:
    """The messages of ``entry`` waiting in the fast queue (every priority list)."""
    found = []
    for key in client.scan_iter(match="fast*"):
        if client.type(key) != b"list":
            continue
        for raw in client.lrange(key, 0, -1):
            headers = json.loads(raw)["headers"]
            if headers.get(ENTRY_HEADER) == entry:
                found.append(headers)
    return sorted(found, key=lambda h: h[SLOT_HEADER])


def slots_of(client: redis.Redis, entry: str) -> list[float]:
    """Published slots, as seconds after START."""
    return [(parse_slot(h[SLOT_HEADER]) - START).total_seconds() for h in published(client, entry)]


def run_for(clock: FakeClock, seconds: float, *beats: Scheduler, step: float = 0.25) -> None:
    """Tick every ``step`` from now to now + ``seconds`` (both included), then move on a step."""
    for _ in range(int(seconds / step + 1e-9) + 1):
        for each in beats:
            each.tick()
        clock.advance(step)


def test_two_beats_publish_each_slot_once(app: Any, client: redis.Redis) -> None:
    clock = FakeClock(START)
    entries = {"tick": every(1, overlap="allow")}
    a, b = beat(app, entries, clock, "a"), beat(app, entries, clock, "b")
    run_for(clock, 10.1, a, b)
    # New at 0 s: the first slot is 1 s; then one per second, each published once.
    assert slots_of(client, "tick") == [float(s) for s in range(1, 11)]
    assert a.leading and not b.leading
    headers = published(client, "tick")[0]
    assert headers["task"] == "beatint.job" and headers["celery_beat_task"] is True


def test_a_standby_does_not_resend_a_slot_the_dead_leader_sent(
    app: Any, client: redis.Redis
) -> None:
    clock = FakeClock(START)
    entries = {"tick": every(1, overlap="allow")}
    a, b = beat(app, entries, clock, "a"), beat(app, entries, clock, "b")
    run_for(clock, 3.1, a, b)  # a leads and sent 1, 2, 3
    # a sends slot 4 and dies before recording its progress; its lock runs out.
    clock.advance(0.9)
    policy = a._policy("tick", a.schedule["tick"])
    assert a._send("tick", a.schedule["tick"], policy, START + dt.timedelta(seconds=4))
    client.delete(a.leader.key)
    run_for(clock, 2.1, b)  # b takes over: slot 4 is due for it too
    assert b.leading
    assert slots_of(client, "tick") == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert b.state.skipped("tick", "taken") == 1


def test_a_closed_beat_never_leads_again_even_if_its_exit_was_swallowed(
    app: Any, client: redis.Redis
) -> None:
    # Celery's SIGTERM handler closes the scheduler, then raises SystemExit; raised inside a
    # publish it can surface as an I/O error the send's handler logs, and beat ticks on.
    clock = FakeClock(START)
    entries = {"tick": every(1, overlap="allow")}
    a, b = beat(app, entries, clock, "a"), beat(app, entries, clock, "b")
    run_for(clock, 2.1, a, b)
    a.close()
    assert not a.leading and client.get(a.leader.key) is None
    with pytest.raises(SystemExit):
        a.tick()
    run_for(clock, 2.1, b)
    assert b.leading and not a.leading


def test_a_paused_leader_that_resumes_sends_nothing(app: Any, client: redis.Redis) -> None:
    clock = FakeClock(START)
    entries = {"tick": every(1, overlap="allow")}
    a, b = beat(app, entries, clock, "a"), beat(app, entries, clock, "b")
    run_for(clock, 2.1, a, b)
    client.delete(a.leader.key)  # a is stopped (SIGSTOP, a long GC) past its lock timeout
    run_for(clock, 3.0, b)
    run_for(clock, 2.0, a, b)  # a wakes up
    assert not a.leading and b.leading
    slots = slots_of(client, "tick")
    assert slots == sorted(set(slots)) and slots[-1] == 7.0


@pytest.mark.parametrize(("catch_up", "late_sent"), [(0, 0), (1, 1), (3, 3)])
def test_after_downtime_at_most_catch_up_missed_slots_are_sent(
    app: Any, client: redis.Redis, catch_up: int, late_sent: int
) -> None:
    clock = FakeClock(START)
    a = beat(app, {"tick": every(1, overlap="allow", catch_up=catch_up)}, clock, "a")
    run_for(clock, 2.1, a)  # sent 1, 2
    a.close()  # beat stops cleanly; 10 slots pass
    clock.advance(10)
    a = beat(app, {"tick": every(1, overlap="allow", catch_up=catch_up)}, clock, "a2")
    a.tick()  # at 12.35 s: slots 3..12 are due, 12 is on time
    missed = [s for s in slots_of(client, "tick") if 2 < s < 12]
    assert len(missed) == late_sent
    assert missed == [float(s) for s in range(12 - late_sent, 12)]  # the newest ones
    assert slots_of(client, "tick")[-1] == 12.0
    assert a.state.skipped("tick", "missed") == 9 - late_sent


def test_a_nightly_job_missed_by_hours_runs_once_when_beat_returns(
    app: Any, client: redis.Redis
) -> None:
    from celery.schedules import crontab

    clock = FakeClock(START - dt.timedelta(hours=1))  # 01:00
    entries = {"nightly": {"task": "beatint.job", "schedule": crontab(minute=0, hour=2)}}
    first = beat(app, entries, clock, "a")
    first.tick()
    first.close()
    clock.advance(dt.timedelta(days=3, hours=6))  # down over four nights, back at 07:00
    beat(app, entries, clock, "b").tick()
    assert slots_of(client, "nightly") == [3 * 86400.0]  # the newest missed night, once


def test_overlap_skip_holds_slots_until_the_run_ends(app: Any, client: redis.Redis) -> None:
    clock = FakeClock(START)
    a = beat(app, {"slow": every(1), "free": every(1, overlap="allow")}, clock, "a")
    run_for(clock, 3.1, a)  # slow: slot 1 sent; 2 and 3 skipped (its run never ended)
    assert slots_of(client, "slow") == [1.0]
    assert slots_of(client, "free") == [1.0, 2.0, 3.0]
    assert a.state.skipped("slow", "overlap") == 2
    assert a.records.holder("slow", START + dt.timedelta(seconds=2)) == "skipped:overlap:a"
    # The run ends (the worker's task_postrun receiver clears the marker).
    run_id = published(client, "slow")[0]["id"]
    assert a.markers.holder("slow") == run_id
    a.markers.release("slow", run_id)
    run_for(clock, 1.0, a)
    assert slots_of(client, "slow") == [1.0, 4.0]


def test_a_failed_publish_is_undone_and_the_slot_sent_next_tick(
    app: Any, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(START)
    a = beat(app, {"tick": every(1)}, clock, "a")
    run_for(clock, 0.75, a)
    real_publish = a._publish
    failures = []

    def broker_down_once(*args: Any) -> Any:
        if not failures:
            failures.append(args)
            raise OperationalError("connection refused")
        return real_publish(*args)

    monkeypatch.setattr(a, "_publish", broker_down_once)
    a.tick()  # slot 1: publish fails
    assert slots_of(client, "tick") == [] and failures
    assert a.records.holder("tick", START + dt.timedelta(seconds=1)) is None
    assert a.markers.holder("tick") is None
    clock.advance(0.3)
    a.tick()
    assert slots_of(client, "tick") == [1.0]


def test_bad_entry_options_stop_beat_at_start(app: Any) -> None:
    with pytest.raises(ConfigError, match=r"'tick'.*overlap"):
        beat(app, {"tick": every(1, overlap="sometimes")}, FakeClock(START), "a")
    with pytest.raises(ConfigError, match="task_id"):
        beat(app, {"tick": every(1, task_id="fixed")}, FakeClock(START), "a")


def test_a_beat_does_not_lead_another_apps_schedule(app: Any, redis_url: str) -> None:
    other = create_app(f"other-{uuid.uuid4().hex[:6]}", broker_url=redis_url)
    clock = FakeClock(START)
    a = beat(app, {"tick": every(1)}, clock, "a")
    other.conf.beat_schedule = {}
    b = Scheduler(app=other, clock=clock.now, sender_id="b")
    a.tick()
    b.tick()
    assert a.leading and b.leading


# -- the worker's receivers: they extend and clear the overlap marker -----------------------


def with_request(task: Any, task_id: str, headers: dict[str, Any] | None) -> None:
    task.push_request(id=task_id, headers=headers)


def test_receivers_extend_the_marker_per_attempt_and_clear_it_when_the_job_ends(
    app: Any, client: redis.Redis
) -> None:
    task, markers = app.tasks["beatint.job"], running.markers_for(app.conf.broker_url)
    name, run_id = f"e-{uuid.uuid4().hex[:6]}", "run-1"
    markers.acquire(name, run_id, ttl_s=5)
    with_request(task, run_id, {ENTRY_HEADER: name})
    try:
        running._on_prerun(sender=task, task_id=run_id, task=task)
        # hard limit (10 s) + the queue wait bound
        assert client.pttl(running.running_key(name)) > 10_000
        running._on_postrun(sender=task, task_id=run_id, task=task, state="RETRY")
        assert markers.holder(name) == run_id  # a retry is the same job
        running._on_postrun(sender=task, task_id=run_id, task=task, state="SUCCESS")
        assert markers.holder(name) is None
    finally:
        task.pop_request()


def test_a_failure_seen_without_headers_clears_by_task_id_but_a_lost_worker_does_not(
    app: Any,
) -> None:
    from billiard.exceptions import WorkerLostError

    task, markers = app.tasks["beatint.job"], running.markers_for(app.conf.broker_url)
    name, run_id = f"e-{uuid.uuid4().hex[:6]}", "run-2"
    markers.acquire(name, run_id, ttl_s=60)
    with_request(task, "other", None)  # the main process: no headers of this run
    try:
        running._on_failure(sender=task, task_id=run_id, exception=WorkerLostError("lost"))
        assert markers.holder(name) == run_id  # retried on worker loss: not over
        running._on_failure(sender=task, task_id=run_id, exception=TimeoutError("time limit"))
        assert markers.holder(name) is None
    finally:
        task.pop_request()
