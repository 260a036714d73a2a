"""Tasks for the worker-lease tests: the app keeps every delivery setting at its default
(visibility timeout 1 h, lease 15 s, restore interval 5 s) unless the environment says
otherwise (``JOBS_VISIBILITY_TIMEOUT``... for the "runs longer than the visibility timeout"
case).

``hold`` records each start (tests.support.recording) and its end in ``jptest:done:<key>``;
it sleeps ``first_s`` on its first run and ``then_s`` on later ones, so a test can kill the
worker running it and see the next run finish quickly.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.recording import client, record

app = create_app("leaseapp")


@app.task(base=ReliableTask, bind=True, name="lease.hold", queue="fast", max_retries=3)
def hold(self: Any, key: str, first_s: float, then_s: float = 0.0) -> int:
    runs = record(self, key)
    time.sleep(first_s if runs == 1 else then_s)
    client().rpush(f"jptest:done:{key}", str(self.request.id))
    return runs


@app.task(base=ReliableTask, bind=True, name="lease.kills_its_worker", queue="fast", max_retries=1)
def kills_its_worker(self: Any, key: str) -> None:
    """SIGKILLs its whole worker (the main process, then itself) on every run: the job a
    lease gives back must still reach the delivery cap and a ``worker_lost`` dead letter."""
    record(self, key)
    os.kill(os.getppid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
