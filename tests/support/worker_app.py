"""Tasks that real worker processes run in the acceptance tests (see recording.py).

The broker URL comes from ``JOBS_BROKER_URL`` (the test session's own Redis database).
"""

from __future__ import annotations

import os
from typing import Any

from celery import signals

from jobs_platform import PermanentError, ReliableTask, TransientError, create_app
from tests.support.recording import record, record_failure

app = create_app(
    "testapp",
    retry_backoff=float(os.environ.get("JOBS_TEST_BACKOFF", "0.5")),
    retry_backoff_max=4.0,
)


@signals.task_failure.connect
def _count_failure(
    sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
) -> None:
    if getattr(sender, "app", None) is not app:
        return  # a receiver for every app in the process: record only this app's failures
    record_failure(task_id, exception)


@app.task(base=ReliableTask, bind=True, name="tests.flaky", queue="fast", max_retries=5)
def flaky(self: Any, key: str, failures: int) -> str:
    if record(self, key) <= failures:
        raise TransientError(f"flaky failure for {key}")
    return "ok"


@app.task(
    base=ReliableTask,
    bind=True,
    name="tests.always_fails",
    queue="fast",
    max_retries=3,
    retry_backoff=0.2,
    retry_backoff_max=0.4,
)
def always_fails(self: Any, key: str) -> None:
    record(self, key)
    raise ConnectionError("partner refused the connection")


@app.task(base=ReliableTask, bind=True, name="tests.permanent", queue="fast", max_retries=5)
def permanent(self: Any, key: str) -> None:
    record(self, key)
    raise PermanentError("invoice 42 does not exist")


@app.task(base=ReliableTask, bind=True, name="tests.heavy_flaky", queue="heavy", max_retries=3)
def heavy_flaky(self: Any, key: str, failures: int) -> str:
    if record(self, key) <= failures:
        raise TimeoutError("render farm timed out")
    return "ok"


@app.task(base=ReliableTask, bind=True, name="tests.record", queue="fast")
def record_run(self: Any, key: str) -> str:
    record(self, key)
    return key


class ClassFlaky(ReliableTask):
    """The same policy through a subclass with run()."""

    name = "tests.class_flaky"
    queue = "thirdparty"
    max_retries = 3
    retry_backoff = 0.2
    retry_backoff_max = 0.4

    def run(self, key: str, failures: int) -> str:
        if record(self, key) <= failures:
            raise ConnectionResetError("partner reset the connection")
        return "ok"


class_flaky = app.register_task(ClassFlaky())


class ClassPermanent(ReliableTask):
    name = "tests.class_permanent"
    queue = "thirdparty"

    def run(self, key: str) -> None:
        record(self, key)
        raise ValueError("malformed account id")


class_permanent = app.register_task(ClassPermanent())
