"""Routing table, worker profiles, attempt-history header and in-process retries (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from jobs_platform import ConfigError, history
from jobs_platform.profiles import PROFILES, worker_argv
from jobs_platform.retry.inprocess import quick_retry
from jobs_platform.routing import Router


def test_router_declared_first_then_globs() -> None:
    router = Router({"media.*": "heavy", "*": "fast"})
    router.declare("media.special", "thirdparty")
    assert router.queue_for("media.special") == "thirdparty"
    assert router.queue_for("media.resize") == "heavy"
    assert router.queue_for("other") == "fast"
    with pytest.raises(ConfigError, match="known queues"):
        router.declare("x", "nope")


def test_every_profile_is_at_least_once_and_has_sane_limits() -> None:
    assert set(PROFILES) == {"fast", "heavy", "thirdparty"}
    for name, profile in PROFILES.items():
        assert profile.queue == name
        assert profile.prefetch_multiplier == 1
        assert 0 < profile.soft_time_limit_s < profile.time_limit_s < 3600 - 60
        assert profile.concurrency >= 1


def test_worker_argv_is_the_documented_command() -> None:
    argv = worker_argv("tasks", "heavy", hostname="heavy@box")
    assert argv[:4] == ["celery", "-A", "tasks", "worker"]
    assert argv[argv.index("-Q") + 1] == "heavy"
    assert argv[argv.index("-P") + 1] == PROFILES["heavy"].pool
    assert "--max-tasks-per-child" in argv
    with pytest.raises(ConfigError):
        worker_argv("tasks", "slow")


def test_history_is_bounded_and_keeps_numbering() -> None:
    headers: dict[str, object] = {"other": 1}
    for n in range(1, history.MAX_ENTRIES + 11):
        headers = history.with_error(headers, history.describe(ValueError("x" * 5000), n))
    errors = history.errors_of(headers)
    assert len(errors) == history.MAX_ENTRIES
    assert errors[0]["attempt"] == 11 and errors[-1]["attempt"] == history.MAX_ENTRIES + 10
    assert len(errors[0]["message"]) == history.MAX_MESSAGE_CHARS
    assert errors[0]["type"] == "builtins.ValueError"
    assert headers["other"] == 1


def test_quick_retry_retries_only_calls_that_never_left() -> None:
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("nobody listening")
        return "ok"

    for attempt in quick_retry(max_wait_s=0.01):
        with attempt:
            result = flaky()
    assert result == "ok" and len(calls) == 3


@pytest.mark.parametrize(
    "exc",
    [ConnectionResetError("reset"), TimeoutError("read timed out"), ValueError("bad input")],
)
def test_quick_retry_never_repeats_a_call_the_server_may_have_acted_on(exc: Exception) -> None:
    calls: list[int] = []
    with pytest.raises(type(exc)):
        for attempt in quick_retry(max_wait_s=0.01):
            with attempt:
                calls.append(1)
                raise exc
    assert len(calls) == 1


def test_quick_retry_gives_up_and_reraises_the_original() -> None:
    calls: list[int] = []
    with pytest.raises(ConnectionRefusedError, match="down"):
        for attempt in quick_retry(attempts=2, max_wait_s=0.01):
            with attempt:
                calls.append(1)
                raise ConnectionRefusedError("down")
    assert len(calls) == 2


def test_every_profile_uses_a_pool_that_enforces_time_limits() -> None:
    from jobs_platform.rules import LIMIT_ENFORCING_POOLS
    from jobs_platform.startup import pool_name

    for profile in PROFILES.values():
        assert profile.pool in LIMIT_ENFORCING_POOLS
    assert pool_name("celery.concurrency.thread") == "threads"
    assert pool_name("celery.concurrency.prefork") == "prefork"


@pytest.mark.parametrize("pool", ["threads", "solo", "eventlet"])
def test_pools_that_cannot_stop_a_hung_task_are_refused(pool: str) -> None:
    from jobs_platform.rules import check_pool

    with pytest.raises(ConfigError, match=r"does not enforce hard time limits.*-P gevent"):
        check_pool(pool)


def test_gevent_is_accepted_and_brings_the_watchdog() -> None:
    from celery.utils.imports import symbol_by_name

    from jobs_platform.cooperative.policy import COOPERATIVE_POOLS
    from jobs_platform.cooperative.steps import Cooperative
    from jobs_platform.rules import check_pool
    from jobs_platform.startup import RefuseUnsafePool, pool_name

    check_pool("gevent")
    assert pool_name("celery.concurrency.gevent") in COOPERATIVE_POOLS
    # Every worker that runs the pool check gets the watchdog step with it.
    assert any(symbol_by_name(dep) is Cooperative for dep in RefuseUnsafePool.requires)


def test_watchdog_deadline_is_hard_limit_plus_grace_within_the_margin() -> None:
    from jobs_platform.cooperative.policy import Running, grace_for, overdue, tick_for

    assert grace_for(60) == 5.0 and grace_for(2) == 1.0
    assert tick_for(1.0) == 0.5 and tick_for(5.0) == 1.0
    with pytest.raises(ValueError):
        grace_for(0)
    jobs = [
        Running("a", "t.a", started_at=100.0, hard_limit_s=10.0),  # due at 111
        Running("b", "t.b", started_at=95.0, hard_limit_s=None),  # no limit: due at 95+50
        Running("c", "t.c", started_at=90.0, hard_limit_s=20.0),  # due at 111
    ]
    assert overdue(jobs, now=111.0, grace_s=1.0, budget_s=50.0) == []
    late = overdue(jobs, now=111.5, grace_s=1.0, budget_s=50.0)
    assert [j.task_id for j in late] == ["c", "a"]  # oldest first
    assert [j.task_id for j in overdue(jobs, now=146, grace_s=1.0, budget_s=50.0)] == [
        "c",
        "b",
        "a",
    ]


class _Task:
    time_limit = 30.0


class _Request:
    def __init__(self, task_id: str, started: float | None, limits: tuple[object, ...]) -> None:
        self.id, self.name, self.time_start, self.time_limits = task_id, "t.x", started, limits
        self.task = _Task()


def test_watchdog_reads_running_jobs_with_their_hard_limits() -> None:
    from jobs_platform.cooperative.watchdog import running_jobs

    requests = [
        _Request("own", 10.0, (5.0, 4.0)),  # the message's own limit wins
        _Request("task", 20.0, (None, None)),  # else the task's
        _Request("queued", None, (None, None)),  # not started: not running
    ]
    jobs = {j.task_id: j for j in running_jobs(requests)}
    assert set(jobs) == {"own", "task"}
    assert jobs["own"].hard_limit_s == 5.0 and jobs["task"].hard_limit_s == 30.0
    assert jobs["own"].started_at == 10.0


def test_watchdog_ends_the_worker_even_when_the_broker_is_unreachable(
    capfd: pytest.CaptureFixture[str],
) -> None:
    from jobs_platform.cooperative.policy import EXIT_STATUS, Running
    from jobs_platform.cooperative.watchdog import Monitor
    from jobs_platform.testing import free_port

    exits: list[int] = []
    monitor = Monitor(
        coordination_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        hostname="w@test",
        grace_s=1.0,
        budget_s=50.0,
        exit=exits.append,
    )
    monitor.end_worker([Running("id-1", "t.spin", started_at=0.0, hard_limit_s=1.0)])
    assert exits == [EXIT_STATUS]
    err = capfd.readouterr().err
    assert "jobs.watchdog.worker_ended: w@test: t.spin[id-1]" in err
    assert "jobs.watchdog.mark_failed" in err


def test_a_cooperative_worker_pools_a_broker_connection_per_greenlet() -> None:
    from jobs_platform.cooperative.policy import broker_connections

    assert broker_connections(100, None) == 110  # kombu's default of 10 would fail acks
    assert broker_connections(1, None) == 11
    assert broker_connections(4, 500) == 500  # a larger configured pool is kept


class _Timer:
    def __init__(self) -> None:
        self.calls: list[Any] = []

    def call_after(self, secs: float, fun: object) -> None:
        self.calls.append(fun)


class _Dispatcher:
    buffer_group: frozenset[str] = frozenset()
    on_send_buffered: Any = None

    def __init__(self) -> None:
        self.flushes: list[tuple[bool, bool]] = []

    def flush(self, errors: bool = True, groups: bool = True) -> None:
        self.flushes.append((errors, groups))


class _Consumer:
    hub = None

    def __init__(self) -> None:
        self.timer, self.event_dispatcher = _Timer(), _Dispatcher()


def test_task_events_of_a_worker_without_event_loop_leave_in_batches() -> None:
    from jobs_platform.cooperative.steps import BufferTaskEvents

    consumer = _Consumer()
    step = BufferTaskEvents(consumer)
    step.start(consumer)
    dispatcher = consumer.event_dispatcher
    assert dispatcher.buffer_group == {"task"}
    # Events that arrive together schedule one flush between them.
    for _ in range(3):
        dispatcher.on_send_buffered()
    assert len(consumer.timer.calls) == 1
    consumer.timer.calls[0]()
    assert dispatcher.flushes == [(False, True)]
    dispatcher.on_send_buffered()
    assert len(consumer.timer.calls) == 2


def test_a_prefork_worker_freezes_its_objects_before_forking() -> None:
    import gc

    from jobs_platform.startup import FreezeBeforeFork

    class Worker:
        pool_cls = "celery.concurrency.gevent"

    gc.unfreeze()
    FreezeBeforeFork(Worker())
    assert gc.get_freeze_count() == 0  # no fork, nothing to keep shared
    Worker.pool_cls = "celery.concurrency.prefork"
    try:
        FreezeBeforeFork(Worker())
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
