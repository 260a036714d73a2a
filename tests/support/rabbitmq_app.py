"""The platform's app on RabbitMQ, for real-worker tests in a vhost of their own.

Workers run ``-A tests.support.rabbitmq_app`` with ``JOBS_BROKER_URL`` (the test's vhost),
``JOBS_COORDINATION_URL`` (the session's Redis database) and ``JOBS_DATABASE_URL``. Tasks
record each run on the coordination Redis (``jptest:rmq:runs:<key>``: one JSON per run).
A test process builds its own app with :func:`make_app` (this module may have been
imported before the test's environment was set).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import time
from types import SimpleNamespace
from typing import Any

import redis

from jobs_platform import ReliableTask, create_app
from jobs_platform.errors import TransientError
from jobs_platform.history import errors_of

TIME_LIMIT = 20.0


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def runs(url: str, key: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in _client(url).lrange(f"jptest:rmq:runs:{key}", 0, -1)]


def record(task: Any, key: str, **extra: Any) -> int:
    """Record this run on the coordination Redis; how many runs ``key`` has had."""
    errors = errors_of(task.request.headers)
    last = errors[-1] if errors else None
    eta = task.request.eta
    entry = {
        "t": time.time(),
        "host": task.request.hostname,
        "retries": task.request.retries,
        "failed_at": last.get("at") if isinstance(last, dict) else None,
        "eta": eta.isoformat() if isinstance(eta, dt.datetime) else eta,
        "task_id": task.request.id,
        **extra,
    }
    url = task.app.jobs_settings.coordination_url
    return int(_client(url).rpush(f"jptest:rmq:runs:{key}", json.dumps(entry)))


def make_app() -> Any:
    return create_app("rabbitmqapp")


def declare(app: Any) -> SimpleNamespace:
    @app.task(
        base=ReliableTask, bind=True, name="rmq.record_run", queue="fast", time_limit=TIME_LIMIT
    )
    def record_run(self: Any, key: str) -> str:
        record(self, key)
        return "ran"

    @app.task(
        base=ReliableTask,
        bind=True,
        name="rmq.always_fails",
        queue="fast",
        time_limit=TIME_LIMIT,
        max_retries=2,
        retry_backoff=1.5,
        retry_backoff_max=3.0,
    )
    def always_fails(self: Any, key: str) -> str:
        record(self, key)
        raise TransientError("partner down")

    @app.task(base=ReliableTask, bind=True, name="rmq.slow", queue="fast", time_limit=TIME_LIMIT)
    def slow(self: Any, key: str, seconds: float) -> str:
        record(self, key, phase="start")
        time.sleep(seconds)
        record(self, key, phase="end")
        return "done"

    return SimpleNamespace(record_run=record_run, always_fails=always_fails, slow=slow)


if "JOBS_COORDINATION_URL" in os.environ:  # a worker's import (the test sets it first)
    app = make_app()
    tasks = declare(app)
