"""Tasks for tests/acceptance/test_retry_end.py: how a published retry ends its attempt.

The broker (and result backend) is ``JOBS_BROKER_URL``, the test session's own database.
Task events are on, so the worker sends ``task-retried``. A ``task_retry`` receiver records,
per task id, what Celery handed it (``jptest:retry-signal:<task id>``).
"""

from __future__ import annotations

import json
import os
from typing import Any

from celery import signals

from jobs_platform import ReliableTask, TransientError, create_app
from tests.support.recording import client, record

#: The wait before the retry: long enough to read the RETRY state in between.
BACKOFF_S = 3.0

app = create_app(
    "retryend",
    broker_url=os.environ["JOBS_BROKER_URL"],
    task_events="on",
    retry_backoff=BACKOFF_S,
    retry_backoff_max=BACKOFF_S,
    retry_jitter=False,
)


@signals.task_retry.connect
def _record_retry(sender: Any = None, request: Any = None, reason: Any = None, **kw: Any) -> None:
    if getattr(sender, "app", None) is not app:
        return  # a receiver for every app in the process: record only this app's retries
    einfo = kw.get("einfo")
    client().rpush(
        f"jptest:retry-signal:{request.id}",
        json.dumps(
            {
                "sender": sender.name,
                "retries": request.retries,
                "reason": type(reason).__name__,
                "exc": type(reason.exc).__name__,
                "traceback": einfo.traceback,
                "frames_copied": einfo.tb is not None,
            }
        ),
    )


@app.task(base=ReliableTask, bind=True, name="retryend.flaky", queue="fast", max_retries=3)
def flaky(self: Any, key: str, failures: int) -> str:
    if record(self, key) <= failures:
        raise TransientError(f"partner unavailable for {key}")
    return key


@app.task(base=ReliableTask, bind=True, name="retryend.after", queue="fast")
def after(self: Any, value: str, key: str) -> str:
    """A link callback: records that it ran, with what the linked task returned."""
    record(self, key)
    client().rpush(f"jptest:after:{key}", value)
    return value
