"""The end of an attempt whose retry ReliableTask has already published, made cheap.

Celery ends every retry the same way: the worker's tracer catches the ``Retry`` and builds
billiard's ``ExceptionInfo`` of it, a picklable copy of every frame of the traceback (the
tracer's own frame carries some 2,300 code positions) plus the formatted traceback, chained
exceptions included; the copy is pickled back to the worker's main process. That was half
of a retry's worker CPU, spent on frames nobody reads: the failure is already in the attempt
history (message headers), and a job that gives up fails through Celery's ordinary path,
full traceback and all.

:class:`PublishedRetry` marks the retries ReliableTask raised after publishing the next
attempt. :func:`install` makes the tracer's ``ExceptionInfo`` build, for those alone, an
``ExceptionInfo`` without frames whose text is the error's type and message; everything
else Celery does with a retry is left as it is (the RETRY state in the result backend,
``on_retry``, the ``task_retry`` signal, the log line, the ``task-retried`` event with that
text). Every other exception gets billiard's ``ExceptionInfo``, as before.

This module replaces one name in ``celery.app.trace`` (``ExceptionInfo``, which the tracer
only calls; :mod:`jobs_platform.internals` lists it). Every worker installs it when it is
built (:class:`CheapRetryStep`, before the pool forks its children); if Celery's tracer no
longer has that name, the worker says so once at start-up and counts it in
``jobs_internals_unavailable_total{name}``, and its retries cost what Celery's cost.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from celery import bootsteps
from celery.exceptions import Retry

from jobs_platform.history import qualified_name
from jobs_platform.metrics import names
from jobs_platform.metrics.counters import RecordedCounter

logger = logging.getLogger("jobs_platform.task")

#: The name this module replaces, as :mod:`jobs_platform.internals` lists it.
PATCHED = "celery.app.trace.ExceptionInfo"
UNAVAILABLE = RecordedCounter(names.INTERNALS_UNAVAILABLE)

_lock = threading.Lock()


class PublishedRetry(Retry):  # type: ignore[misc]
    """A ``Retry`` whose next attempt is already on the broker (ReliableTask raised it)."""


def retry_text(retry: Retry) -> str:
    """What a published retry reports instead of a traceback: Celery's last line of one
    (``Retry in 2s: ConnectionError('...')``), and why there are no frames."""
    return (
        f"{qualified_name(type(retry))}: {retry}\n"
        "(no traceback is recorded for a retry: the error history travels in the message "
        "headers, and a final failure keeps its full traceback)\n"
    )


def exception_info(exc_info: Any = None, internal: bool = False) -> ExceptionInfo:
    """billiard's ``ExceptionInfo``, except for a :class:`PublishedRetry`: one without frames
    (``tb`` is None) and with :func:`retry_text` as its traceback."""
    if exc_info is not None and isinstance(exc_info[1], PublishedRetry):
        return _without_frames(exc_info[1], internal)
    return ExceptionInfo(exc_info, internal)


def _without_frames(retry: PublishedRetry, internal: bool) -> ExceptionInfo:
    # The same class and attributes as billiard's own, so the worker's main process and
    # Task.apply() read it as they read any other.
    info: ExceptionInfo = ExceptionInfo.__new__(ExceptionInfo)
    text = retry_text(retry)
    info.type = type(retry)
    info.tb = None
    info.traceback = text
    info.internal = internal
    info.exception = ExceptionWithTraceback(retry, text)
    return info


def install() -> bool:
    """Route the tracer's ``ExceptionInfo`` through :func:`exception_info` (idempotent).

    Returns False, changing nothing, if ``celery.app.trace`` no longer has the name (a
    Celery whose tracer works differently): retries then cost what Celery's cost.
    """
    from celery.app import trace

    if trace.ExceptionInfo is exception_info:  # the path of every retry after the first
        return True
    with _lock:
        current = getattr(trace, "ExceptionInfo", None)
        if current is exception_info:
            return True
        if current is not ExceptionInfo:
            return False
        trace.ExceptionInfo = exception_info
        return True


class CheapRetryStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Installs the frameless retry end in the worker before its pool forks, and says once,
    when the worker starts, if it could not (counted: the metrics are recording by then)."""

    label = "jobs-platform cheap retries"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.installed = install()

    def start(self, worker: Any) -> None:
        if self.installed:
            return
        UNAVAILABLE.labels(PATCHED).inc()
        logger.warning(
            "jobs.internals.unavailable: %s is not billiard's ExceptionInfo in this Celery: "
            "retries record full tracebacks again and cost about twice the CPU "
            "(see jobs_platform/internals.py)",
            PATCHED,
            extra={"event": "jobs.internals.unavailable", "internal": PATCHED},
        )
