"""Tasks for worker-death tests, on an app with a short visibility timeout (8 s).

Short limits are needed so that a killed worker's message comes back within a test;
start-up refusal forces every limit below the visibility timeout minus the margin.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.recording import record

app = create_app(
    "redelivery",
    visibility_timeout=8.0,
    visibility_margin=2.0,
    unacked_restore_interval=1.0,
    worker_lease=3.0,
    retry_backoff=0.2,
    retry_backoff_max=0.5,  # wait + hard limit (5 s) must stay below 8 - 2
)


@app.task(
    base=ReliableTask,
    bind=True,
    name="redelivery.slow_once",
    queue="fast",
    time_limit=5.0,
    max_retries=3,
)
def slow_once(self: Any, key: str, seconds: float) -> str:
    """Sleeps on its first run only, so a test can kill or stop the worker meanwhile."""
    if record(self, key) == 1:
        time.sleep(seconds)
    return "done"


@app.task(
    base=ReliableTask,
    bind=True,
    name="redelivery.kills_its_worker",
    queue="fast",
    time_limit=5.0,
    max_retries=2,
)
def kills_its_worker(self: Any, key: str, times: int) -> str:
    """SIGKILLs its own pool process on its first ``times`` runs (a poison job)."""
    if record(self, key) <= times:
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"
