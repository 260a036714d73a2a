"""Tasks for the bad-input and broker-restart acceptance tests.

Configured from the environment (``JOBS_BROKER_URL``, ``JOBS_DATABASE_URL``: the test's
private redis-server and its own SQLite file). Each task records its start in
``jptest:runs:<key>`` (tests.support.recording) and its end in ``jptest:done:<key>``, and
there is one on each queue, so a test can see which worker ran a job and whether it
finished. ``JOBS_MAX_PAYLOAD_BYTES`` is small here (4 KiB): an oversized message is cheap.
"""

from __future__ import annotations

import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.recording import client, record

#: The app's JOBS_MAX_PAYLOAD_BYTES.
PAYLOAD_LIMIT = 4096

app = create_app(
    "poisonapp", dlq_drain_interval=0.5, max_payload_bytes=PAYLOAD_LIMIT, retry_backoff=0.2
)


def _run(task: Any, key: str, count: int, sleep_s: float) -> int:
    total = count + 1  # a count that is not a number: TypeError, a permanent failure
    record(task, key)
    time.sleep(sleep_s)  # a job that is still running when the broker goes away
    client().rpush(f"jptest:done:{key}", str(task.request.id))
    return total


@app.task(base=ReliableTask, bind=True, name="poison.fast", queue="fast", max_retries=3)
def fast(self: Any, key: str, count: int = 0, sleep_s: float = 0.0) -> int:
    return _run(self, key, count, sleep_s)


@app.task(base=ReliableTask, bind=True, name="poison.heavy", queue="heavy", max_retries=3)
def heavy(self: Any, key: str, count: int = 0, sleep_s: float = 0.0) -> int:
    return _run(self, key, count, sleep_s)


@app.task(base=ReliableTask, bind=True, name="poison.thirdparty", queue="thirdparty", max_retries=3)
def thirdparty(self: Any, key: str, count: int = 0, sleep_s: float = 0.0) -> int:
    return _run(self, key, count, sleep_s)


BY_QUEUE = {"fast": fast, "heavy": heavy, "thirdparty": thirdparty}
