"""Tasks that die on every terminal path, for the dead-letter acceptance tests.

The worker reads ``JOBS_BROKER_URL`` and ``JOBS_DATABASE_URL`` from its environment (the
test's own Redis DB and database). ``dlq.fixable`` fails until the Redis key
``jptest:fixed:<key>`` exists, so a test can "fix the cause" and replay.
"""

from __future__ import annotations

import json
import os
import signal
import time
from typing import Any

import redis
from celery.exceptions import Reject, SoftTimeLimitExceeded

from jobs_platform import PermanentError, ReliableTask, coordination, create_app

app = create_app("dlqapp", retry_backoff=0.2, retry_backoff_max=0.4, dlq_drain_interval=0.5)
_redis = redis.Redis.from_url(coordination.url_of(app.jobs_settings))  # Redis or RabbitMQ


@app.task(base=ReliableTask, name="dlq.exhausted", queue="fast", max_retries=3)
def exhausted(key: str, password: str = "") -> None:
    raise ConnectionError(f"partner refused connection #{key}")


@app.task(base=ReliableTask, name="dlq.permanent", queue="fast")
def permanent(key: str) -> None:
    raise PermanentError(f"invoice {key} does not exist")


@app.task(
    base=ReliableTask, name="dlq.time_limit", queue="heavy", time_limit=1.0, soft_time_limit=0.5
)
def time_limit(key: str) -> None:
    try:
        time.sleep(10)
    except SoftTimeLimitExceeded:
        time.sleep(10)  # ignore the soft limit: only the hard one stops us


@app.task(base=ReliableTask, name="dlq.worker_lost", queue="heavy", max_retries=1)
def worker_lost(key: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(base=ReliableTask, name="dlq.rejected", queue="fast")
def rejected(key: str) -> None:
    raise Reject(f"malformed request {key}", requeue=False)


@app.task(base=ReliableTask, name="dlq.fixable", queue="fast", max_retries=0)
def fixable(key: str, amount: int = 0) -> str:
    if not _redis.exists(f"jptest:fixed:{key}"):
        raise PermanentError(f"account {key} is frozen")
    _redis.rpush(f"jptest:ran:{key}", amount)
    return "ok"


@app.task(base=ReliableTask, name="dlq.ok", queue="fast")
def ok(key: str) -> str:
    return key


@app.task(base=ReliableTask, name="dlq.typed", queue="fast", max_retries=1)
def typed(key: str, when: Any, amount: Any = None, ref: Any = None) -> str:
    """Records the type and value of what arrived; retried, then dead, until fixed."""
    seen = [[type(v).__name__, str(v)] for v in (when, amount, ref)]
    _redis.rpush(f"jptest:typed:{key}", json.dumps(seen))
    if not _redis.exists(f"jptest:fixed:{key}"):
        raise ConnectionError(f"partner down for {key}")
    return "ok"
