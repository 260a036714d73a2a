"""Quick in-process retries of cheap calls inside a task (an HTTP request, a cache read).

A task that makes several cheap calls should not go back through the broker because one
connection attempt failed. ``quick_retry()`` gives a tenacity ``Retrying`` that retries
only errors proving the request never left (connection refused, DNS failure, connect
timeout), a few times with short jittered waits, then re-raises the original exception
so the task's own policy (through the broker) decides. A read timeout or a reset
connection is *not* retried here: the server may already have acted, and only the task's
idempotency guards can make a repeat safe.
"""

from __future__ import annotations

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from jobs_platform.retry.classify import never_sent


def quick_retry(attempts: int = 3, *, max_wait_s: float = 1.0, budget_s: float = 5.0) -> Retrying:
    """Tenacity ``Retrying`` for cheap calls: ``for attempt in quick_retry(): with attempt: ...``"""
    return Retrying(
        retry=retry_if_exception(never_sent),
        stop=stop_after_attempt(attempts) | stop_after_delay(budget_s),
        wait=wait_exponential_jitter(multiplier=0.05, max=max_wait_s),
        reraise=True,
    )
