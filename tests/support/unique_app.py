"""Unique dispatch from inside a job whose pool process dies mid-dispatch, for
tests/acceptance/test_unique_kill.py: ``dispatch_then_die`` takes the charge's unique lock and
is SIGKILLed before it publishes (the window issue 18 names)."""

from __future__ import annotations

import os
import signal
from typing import Any

from jobs_platform import ReliableTask, create_app
from jobs_platform.idempotency import unique
from tests.support.recording import record

#: The publish's bound; the lock taken before publishing lives this + 2 s (unique.pending_s).
DISPATCH_TIMEOUT_S = 1.0

app = create_app("uniqueapp", dispatch_timeout=DISPATCH_TIMEOUT_S, retry_backoff=0.2)


@app.task(
    base=ReliableTask,
    bind=True,
    name="unique.charge",
    queue="fast",
    business_key=("order_id",),
    unique_for=300,
)
def charge(self: Any, order_id: int, key: str) -> None:
    record(self, key)


@app.task(
    base=ReliableTask, bind=True, name="unique.dispatch_then_die", queue="fast", max_retries=0
)
def dispatch_then_die(self: Any, order_id: int, key: str) -> None:
    real = unique.UniqueLocks.acquire

    def acquire_then_die(locks: Any, *args: Any, **kwargs: Any) -> Any:
        taken = real(locks, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)  # the lock is taken, the job never published
        return taken

    unique.UniqueLocks.acquire = acquire_then_die  # type: ignore[method-assign]
    charge.delay(order_id, key)
