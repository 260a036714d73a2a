"""Test tasks record each run in Redis so tests can count attempts and measure gaps.

``jptest:runs:<key>`` gets one JSON record per run (time, host, queue, priority, retries,
history length, and what the message says of its timing: its ``eta`` and when the attempt
before it failed). The Redis is the coordination one (``JOBS_COORDINATION_URL``, on RabbitMQ),
else the broker's (the test session's own database).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import time
from typing import Any

import redis

from jobs_platform.history import errors_of


@functools.cache
def client() -> redis.Redis:
    return redis.Redis.from_url(
        os.environ.get("JOBS_COORDINATION_URL") or os.environ["JOBS_BROKER_URL"]
    )


def record(task: Any, key: str) -> int:
    """Record this run; return how many runs (including this one) ``key`` has had."""
    delivery = task.request.delivery_info or {}
    errors = errors_of(task.request.headers)
    last = errors[-1] if errors else None  # a hand-made message may hold any shape
    eta = task.request.eta
    entry = {
        "t": time.time(),
        "host": task.request.hostname,
        "queue": delivery.get("routing_key"),
        "priority": delivery.get("priority"),
        "retries": task.request.retries,
        "errors": len(errors),
        "failed_at": last.get("at") if isinstance(last, dict) else None,
        "eta": eta.isoformat() if isinstance(eta, dt.datetime) else eta,
        "task_id": task.request.id,
    }
    return int(client().rpush(f"jptest:runs:{key}", json.dumps(entry)))


def record_failure(task_id: str | None, exception: BaseException | None) -> None:
    client().rpush(f"jptest:failures:{task_id}", type(exception).__name__)
