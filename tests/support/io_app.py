"""Tasks for the I/O profile's acceptance tests: a gevent worker, short limits.

The visibility timeout is short (6 s, margin 2 s) so a worker the watchdog ended has its
messages back within a test; every hard limit is 1 s, so the watchdog ends a worker held
by code that never yields after about 2 s (hard limit + grace).
"""

from __future__ import annotations

import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.recording import record

app = create_app(
    "io",
    visibility_timeout=6.0,
    visibility_margin=2.0,
    unacked_restore_interval=0.5,
    worker_lease=2.0,
    retry_backoff=0.2,
    retry_backoff_max=0.5,
)

LIMITS: dict[str, Any] = {"queue": "thirdparty", "time_limit": 1.0}


@app.task(base=ReliableTask, bind=True, name="io.hangs", max_retries=0, **LIMITS)
def hangs(self: Any, key: str) -> None:
    """A partner call that never answers: it waits (and so yields) for ever."""
    record(self, key)
    time.sleep(1000)


@app.task(base=ReliableTask, bind=True, name="io.spins", max_retries=1, **LIMITS)
def spins(self: Any, key: str, times: int) -> str:
    """Busy-loops, never yielding, on its first ``times`` runs (then returns at once)."""
    if record(self, key) <= times:
        deadline = time.monotonic() + 1000
        while time.monotonic() < deadline:
            pass
    return "done"


@app.task(base=ReliableTask, bind=True, name="io.waits", max_retries=0, **LIMITS)
def waits(self: Any, key: str, seconds: float) -> str:
    """A call that answers after ``seconds`` (it yields meanwhile)."""
    record(self, key)
    time.sleep(seconds)
    return "answered"
