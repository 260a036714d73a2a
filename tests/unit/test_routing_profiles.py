"""Routing table, worker profiles, attempt-history header and in-process retries (pure)."""

from __future__ import annotations

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
