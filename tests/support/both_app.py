"""A job whose dead-letter write is interrupted by a SIGTERM, for
tests/acceptance/test_never_both.py.

``fails_then_works`` fails permanently on its first run and would succeed on any later one.
In this worker the dead-letter sink sends its own pool process a SIGTERM (what Celery sends
to cancel a job) just as it starts storing that letter: the platform holds the signal until
the letter is stored, then the process dies, the parent sees a lost worker and Celery
retries the job. That retry must not run: the job is dead already.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from jobs_platform import PermanentError, ReliableTask, create_app
from jobs_platform.deadletter.sink import DeadLetterSink
from tests.support.recording import record

app = create_app("bothapp", retry_backoff=0.2, retry_backoff_max=0.4, dlq_drain_interval=0.5)


@app.task(base=ReliableTask, bind=True, name="both.fails_then_works", queue="fast", max_retries=3)
def fails_then_works(self: Any, key: str) -> str:
    if record(self, key) == 1:
        raise PermanentError(f"order {key} is bad")
    return "worked"


_capture = DeadLetterSink.capture


def _capture_under_sigterm(self: DeadLetterSink, letter: Any, **kwargs: Any) -> Any:
    if letter.task_name == fails_then_works.name:
        os.kill(os.getpid(), signal.SIGTERM)  # held until the letter is stored
    return _capture(self, letter, **kwargs)


DeadLetterSink.capture = _capture_under_sigterm  # type: ignore[method-assign]
