"""Quick in-process retries of cheap calls inside a task (an HTTP request, a cache read).

A task that makes several cheap calls should not go back through the broker because one
connection blipped. ``quick_retry()`` gives a tenacity ``Retrying`` that retries only
what the classifier calls transient, a few times with short jittered waits, then
re-raises the original exception so the task's own policy (through the broker) decides.
"""

from __future__ import annotations

from tenacity import (
    RetryCallState,
    Retrying,
    retry_base,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)

from jobs_platform.retry.classify import Attempt, Retry, default_classifier, http_status


class _retry_if_transient(retry_base):
    def __call__(self, retry_state: RetryCallState) -> bool:
        outcome = retry_state.outcome
        if outcome is None or not outcome.failed:
            return False
        exc = outcome.exception()
        # A status code is the server's answer, not a blip: the task's classifier decides.
        if exc is None or http_status(exc) is not None:
            return False
        decision = default_classifier(
            exc,
            Attempt(
                task_name="in-process",
                number=retry_state.attempt_number,
                retry_unknown_errors=False,
            ),
        )
        return isinstance(decision, Retry)


def quick_retry(attempts: int = 3, *, max_wait_s: float = 1.0, budget_s: float = 5.0) -> Retrying:
    """Tenacity ``Retrying`` for cheap calls: ``for attempt in quick_retry(): with attempt: ...``"""
    return Retrying(
        retry=_retry_if_transient(),
        stop=stop_after_attempt(attempts) | stop_after_delay(budget_s),
        wait=wait_exponential_jitter(multiplier=0.05, max=max_wait_s),
        reraise=True,
    )
