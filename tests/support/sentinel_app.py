"""An app on a Redis Sentinel deployment, for tests/acceptance/test_sentinel_failover.py.

Broker, result backend and coordination are all ``JOBS_BROKER_URL``, a ``sentinel://`` URL
of the test's own Sentinels. What the jobs do is recorded outside Redis (the failover may
drop Redis writes; the record must not): each run appends a line to
``$JPTEST_SENTINEL_DIR/runs/<job>``, and the guarded side effect (an idempotency key in
PostgreSQL, :meth:`~jobs_platform.idempotency.keys.IdempotencyKeys.run_once`) appends one to
``effects/<job>``. Beat sends ``sentinel.tick`` every second (on its own queue, not behind
the load); each tick appends its slot, its enqueue stamp and its start to ``ticks``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

from jobs_platform import ReliableTask, create_app, schedule
from jobs_platform.history import ENQUEUED_HEADER
from jobs_platform.idempotency.keys import IdempotencyKeys

DIR_ENV = "JPTEST_SENTINEL_DIR"

app = create_app(
    "sentinelapp",
    broker_url=os.environ["JOBS_BROKER_URL"],
    visibility_timeout=30.0,
    visibility_margin=2.0,
    unacked_restore_interval=1.0,
    worker_lease=4.0,
    retry_backoff=0.3,
    retry_backoff_max=1.0,
    max_retries=10,
    dlq_drain_interval=0.5,
)
app.conf.beat_schedule = {
    "tick": {"task": "sentinel.tick", "schedule": dt.timedelta(seconds=1), "args": ()},
}


def _append(name: str, record: dict[str, Any]) -> None:
    path = Path(os.environ[DIR_ENV]) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # One write of one line on an O_APPEND file: lines of racing processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


@app.task(
    base=ReliableTask,
    bind=True,
    name="sentinel.effect",
    queue="fast",
    business_key=("job",),
    time_limit=20,
    ignore_result=True,
)
def effect(self: Any, job: str) -> str:
    started = time.time()
    _append(f"runs/{job}", {"t": started, "pid": os.getpid(), "task_id": self.request.id})

    def side_effect() -> str:
        _append(f"effects/{job}", {"t": time.time(), "pid": os.getpid()})
        return "done"

    keys = IdempotencyKeys.for_app(self.app)
    return keys.run_once(self.idempotency_key, side_effect, task=self.name)


@app.task(
    base=ReliableTask,
    bind=True,
    name="sentinel.tick",
    queue="thirdparty",  # not behind the load on fast
    time_limit=10,
    ignore_result=True,
)
def tick(self: Any) -> None:
    headers = self.request.headers or {}
    _append(
        "ticks",
        {
            "slot": headers.get(schedule.SLOT_HEADER),
            "enqueued": headers.get(ENQUEUED_HEADER),
            "started": time.time(),
        },
    )
