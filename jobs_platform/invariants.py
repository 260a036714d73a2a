"""Reliability invariants between a task's limits and the broker's visibility timeout.

Why they matter on the Redis broker: a message that is fetched but not acknowledged
within the visibility timeout is handed to another worker. A delayed message (a retry's
countdown, an ETA) is fetched at once and held unacknowledged by the worker until it is
due, and then it runs; so the *wait plus the run* (hard time limit) must fit in the
visibility timeout minus a margin, or the job runs twice. Pure: no Celery.
"""

from __future__ import annotations

from jobs_platform.errors import ConfigError, DispatchError
from jobs_platform.retry.policy import RetryPolicy


def check_visibility(
    *,
    visibility_timeout_s: float,
    margin_s: float,
) -> None:
    if visibility_timeout_s <= 0:
        raise ConfigError(f"visibility_timeout must be > 0 seconds, got {visibility_timeout_s}")
    if not 0 <= margin_s < visibility_timeout_s:
        raise ConfigError(
            f"visibility_margin ({margin_s} s) must be >= 0 and below "
            f"visibility_timeout ({visibility_timeout_s} s)"
        )


def check_task_limits(
    task_name: str,
    policy: RetryPolicy,
    *,
    hard_limit_s: float | None,
    soft_limit_s: float | None,
    visibility_timeout_s: float,
    margin_s: float,
) -> None:
    """Raise :class:`ConfigError` naming the task when one of its limits is unsafe."""
    budget = visibility_timeout_s - margin_s
    if hard_limit_s is None:
        raise ConfigError(
            f"task {task_name!r} has no hard time limit: set time_limit (seconds) below "
            f"{budget:g} s (visibility timeout {visibility_timeout_s:g} s "
            f"minus margin {margin_s:g} s)"
        )
    for label, value in (("time_limit", hard_limit_s), ("soft_time_limit", soft_limit_s)):
        if value is not None and value <= 0:
            raise ConfigError(f"task {task_name!r}: {label} must be > 0 seconds, got {value}")
    if hard_limit_s >= budget:
        raise ConfigError(
            f"task {task_name!r}: time_limit {hard_limit_s:g} s is not below the visibility "
            f"timeout minus margin ({visibility_timeout_s:g} - {margin_s:g} = {budget:g} s); "
            "a still-running task would be delivered to a second worker"
        )
    if soft_limit_s is not None and soft_limit_s >= hard_limit_s:
        raise ConfigError(
            f"task {task_name!r}: soft_time_limit {soft_limit_s:g} s must be below "
            f"time_limit {hard_limit_s:g} s"
        )
    if policy.longest_wait_s + hard_limit_s >= budget:
        raise ConfigError(
            f"task {task_name!r}: retry_backoff_max {policy.longest_wait_s:g} s plus time_limit "
            f"{hard_limit_s:g} s is not below the visibility timeout minus margin ({budget:g} s); "
            "the broker would redeliver the waiting (or then running) retry and it would run twice"
        )


def check_delay(
    task_name: str,
    delay_s: float,
    *,
    hard_limit_s: float,
    visibility_timeout_s: float,
    margin_s: float,
) -> None:
    """A dispatch-time delay (countdown/ETA) plus the run must fit in the visibility timeout."""
    budget = visibility_timeout_s - margin_s
    if delay_s + hard_limit_s >= budget:
        raise DispatchError(
            f"{task_name}: a delay of {delay_s:g} s plus its time_limit {hard_limit_s:g} s is not "
            f"below the visibility timeout minus margin ({budget:g} s); the Redis broker would "
            "deliver it more than once. For a longer wait, store the due time in your own "
            "table and enqueue due jobs from a periodic task (celery beat), or raise "
            "JOBS_VISIBILITY_TIMEOUT (a killed worker's jobs then come back only after it)."
        )
