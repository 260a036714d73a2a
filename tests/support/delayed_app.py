"""Delayed jobs under a short visibility timeout (6 s, margin 1 s): the platform's app with
the delayed store, and a bare Celery app with the same broker settings for comparison.

Workers run ``-A tests.support.delayed_app`` (or ``...:bare_app``) and read
``JOBS_BROKER_URL`` (the test's own Redis). A test process builds its own apps for its
own broker URL (:func:`make_app`, :func:`make_bare_app`) with the same tasks
(:func:`declare`, :func:`declare_bare`): this module may have been imported before the
test's environment was set. Tasks record each run in Redis (:mod:`tests.support.recording`).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from celery import Celery

from jobs_platform import create_app
from tests.support.recording import record

VISIBILITY_TIMEOUT = 6.0
MARGIN = 1.0
TIME_LIMIT = 2.0
#: The bare app's queue (its worker must not take the platform app's messages).
BARE_QUEUE = "bare"


def make_app(broker_url: str | None = None) -> Any:
    """The platform's app (on Redis, its broker wires the store in)."""
    overrides: dict[str, Any] = {} if broker_url is None else {"broker_url": broker_url}
    made = create_app(
        "delayedapp",
        visibility_timeout=VISIBILITY_TIMEOUT,
        visibility_margin=MARGIN,
        unacked_restore_interval=1.0,
        worker_lease=3.0,
        **overrides,
    )
    return made


def declare(app: Any) -> SimpleNamespace:
    @app.task(bind=True, name="delayed.record_run", time_limit=TIME_LIMIT)
    def record_run(self: Any, key: str) -> str:
        record(self, key)
        return "ran"

    @app.task(bind=True, name="delayed.fail_once", time_limit=TIME_LIMIT, max_retries=3)
    def fail_once(self: Any, key: str, wait_s: float) -> str:
        """Fails its first run and asks to be retried in ``wait_s`` seconds."""
        if record(self, key) == 1:
            raise self.retry(countdown=wait_s, exc=ConnectionError("partner down"))
        return "ran"

    return SimpleNamespace(record_run=record_run, fail_once=fail_once)


def make_bare_app(broker_url: str | None = None) -> Any:
    """Bare Celery: same broker, visibility timeout and restore sweep; no store."""
    bare = Celery("bare", set_as_current=False)
    bare.conf.update(
        broker_url=broker_url or os.environ.get("JOBS_BROKER_URL", "redis://127.0.0.1:6379/0"),
        broker_transport_options={
            "visibility_timeout": VISIBILITY_TIMEOUT,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
        task_default_queue=BARE_QUEUE,
        task_acks_late=True,
        worker_prefetch_multiplier=1,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
    )
    return bare


def declare_bare(bare: Any) -> SimpleNamespace:
    # Not shared: a shared task would be added to every app finalized later in the session.
    @bare.task(bind=True, name="bare.record_run", time_limit=TIME_LIMIT, shared=False)
    def record_run(self: Any, key: str) -> str:
        record(self, key)
        return "ran"

    return SimpleNamespace(record_run=record_run)


app = make_app()
tasks = declare(app)
bare_app = make_bare_app()
bare_tasks = declare_bare(bare_app)
