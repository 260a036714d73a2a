"""Tasks for the worker-lease tests: the app keeps every delivery setting at its default
(visibility timeout 1 h, lease 15 s, restore interval 5 s) unless the environment says
otherwise (``JOBS_VISIBILITY_TIMEOUT``... for the "runs longer than the visibility timeout"
case).

``hold`` records each start (tests.support.recording) and its end in ``jptest:done:<key>``;
it sleeps ``first_s`` on its first run and ``then_s`` on later ones, so a test can kill the
worker running it and see the next run finish quickly.
"""

from __future__ import annotations

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
