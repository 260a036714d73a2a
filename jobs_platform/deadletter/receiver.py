"""Celery signal receivers that turn terminal failures into dead letters.

``task_failure`` covers exhausted retries, permanent errors, hard time limits, workers
lost beyond their cap and ``Reject(requeue=False)``; ``task_revoked(expired=True)`` covers
expired messages; poison messages are caught earlier, in the consumer
(:mod:`.poison`). Some of these signals fire in the pool child (``sender.request`` is the
task's context) and some in the worker's main process, where Celery leaves
``sender.request`` empty; there :class:`.poison.DeadLetterRequest` exposes the request it
is handling, so every path sees the message's headers, queue and history.

The exception ``task_failure`` receives is not always the one the task raised: Celery swaps
one it cannot pickle (urllib's ``HTTPError``, httpx's ``HTTPStatusError``) for a stand-in
such as ``OSError()``. When :class:`~jobs_platform.task.ReliableTask` gives up it notes the
original failure on the task's request (:func:`jobs_platform.history.note_final_failure`),
and that note wins.

Receivers never raise (Celery would only log it): a failure here is logged at ERROR with
its traceback and counted as ``jobs_dead_letter_write_failures_total{stage="receiver"}``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery import signals
from celery.app.task import Context
from celery.exceptions import Reject

from jobs_platform import history
from jobs_platform.clock import utcnow
from jobs_platform.deadletter.metrics import WRITE_FAILURES
from jobs_platform.deadletter.record import DeadLetter, parse_time, row_id_or_none
from jobs_platform.retry.classify import http_status

logger = logging.getLogger("jobs_platform.deadletter")

_local = threading.local()


@contextmanager
def handling(request: Any) -> Iterator[None]:
    """Mark ``request`` (a worker ``Request``) as the one this thread is finishing."""
    previous = getattr(_local, "request", None)
    _local.request = request
    try:
        yield
    finally:
        _local.request = previous


@dataclasses.dataclass
class Origin:
    """What the worker knew about the message when the job died."""

    headers: dict[str, Any]
    delivery_info: dict[str, Any]
    hostname: str | None
    retries: int
    args: Any = None
    kwargs: Any = None
    #: The failure ReliableTask recorded on the task's request (pool child only).
    failure: dict[str, Any] | None = None


def origin_of(sender: Any, task_id: str | None) -> Origin:
    request = getattr(_local, "request", None)
    if request is not None and request.id == task_id:
        data = dict(request.request_dict)
        return Origin(
            headers=dict(Context(data).headers or {}),
            delivery_info=dict(request.delivery_info or {}),
            hostname=request.hostname,
            retries=int(data.get("retries") or 0),
            args=request.args,
            kwargs=request.kwargs,
        )
    context = getattr(sender, "request", None)
    if context is not None and getattr(context, "id", None) == task_id:
        return Origin(
            headers=dict(context.headers or {}),
            delivery_info=dict(context.delivery_info or {}),
            hostname=context.hostname,
            retries=int(context.retries or 0),
            args=context.args,
            kwargs=context.kwargs,
            failure=history.final_failure(context),
        )
    return Origin(headers={}, delivery_info={}, hostname=None, retries=0)


def reason_for(exc: BaseException, failure: dict[str, Any] | None = None) -> str:
    if failure is not None:
        return str(failure["outcome"])
    if isinstance(exc, TimeLimitExceeded):
        return "time_limit"
    if isinstance(exc, WorkerLostError):
        return "worker_lost"
    if isinstance(exc, Reject):
        return "rejected"
    return "permanent"  # a plain task that failed and will not be retried


def _letter(
    task: Any,
    task_id: str | None,
    origin: Origin,
    *,
    reason: str,
    final: dict[str, Any] | None,
    attempts: int,
    args: Any,
    kwargs: Any,
    traceback: str | None,
) -> DeadLetter:
    headers = origin.headers
    errors = history.errors_of(headers) + ([final] if final else [])
    delivery = origin.delivery_info
    enqueued = headers.get(history.ENQUEUED_HEADER)
    replay_of = headers.get(history.REPLAY_OF_HEADER)
    return DeadLetter(
        reason=reason,
        task_id=task_id,
        task_name=str(task.name),
        queue=str(delivery.get("routing_key") or getattr(task, "queue_class", "") or ""),
        errors=errors,
        failed_at=utcnow(),
        args=list(args) if args is not None else None,
        kwargs=dict(kwargs) if kwargs is not None else None,
        headers={k: v for k, v in headers.items() if k != history.ERRORS_HEADER},
        priority=delivery.get("priority"),
        exchange=delivery.get("exchange"),
        routing_key=delivery.get("routing_key"),
        attempts=attempts,
        traceback=traceback,
        worker=origin.hostname,
        enqueued_at=parse_time(enqueued),
        replay_of=row_id_or_none(replay_of),
        chain=str(enqueued or ""),
    )


def final_entry(exc: BaseException, failure: dict[str, Any] | None, attempt: int) -> dict[str, Any]:
    """The last error of the history, with its HTTP ``status`` when there is one."""
    if failure is not None:
        entry = history.entry(
            failure["type"],
            failure["message"],
            attempt,
            at=failure.get("at") if isinstance(failure.get("at"), str) else None,
        )
        status = failure.get("status")
    else:
        entry = history.describe(exc, attempt)
        status = http_status(exc)  # a plain task's exception, when Celery kept it
    if isinstance(status, int) and not isinstance(status, bool):
        entry["status"] = status
    return entry


def failure_letter(
    sender: Any, task_id: str | None, exc: BaseException, args: Any, kwargs: Any, einfo: Any
) -> DeadLetter:
    origin = origin_of(sender, task_id)
    attempt = origin.retries + 1
    return _letter(
        sender,
        task_id,
        origin,
        reason=reason_for(exc, origin.failure),
        final=final_entry(exc, origin.failure, attempt),
        attempts=attempt,
        args=args if args is not None else origin.args,
        kwargs=kwargs if kwargs is not None else origin.kwargs,
        traceback=str(getattr(einfo, "traceback", "") or "") or None,
    )


def expired_letter(sender: Any, request: Any) -> DeadLetter:
    task_id = getattr(request, "id", None)
    origin = origin_of(sender, task_id)
    expires = getattr(request, "expires", None)
    final = history.entry(
        "celery.exceptions.TaskRevokedError",
        f"expired at {expires} before it ran",
        origin.retries + 1,
    )
    return _letter(
        sender,
        task_id,
        origin,
        reason="expired",
        final=final,
        attempts=origin.retries,
        args=origin.args,
        kwargs=origin.kwargs,
        traceback=None,
    )


def _enabled(sender: Any) -> bool:
    app = getattr(sender, "app", None)
    return app is not None and getattr(app, "jobs_settings", None) is not None


def capture(app: Any, build: Any, *build_args: Any, main_process: bool = False) -> None:
    """Build a dead letter and hand it to the sink; never raises.

    In the worker's main process (``main_process``, or while it finishes a request) the
    database write is deferred to the drainer thread.
    """
    try:
        from jobs_platform.deadletter.sink import sink_for  # SQLAlchemy: on failure only

        defer = main_process or getattr(_local, "request", None) is not None
        sink_for(app).capture(build(*build_args), defer=defer)
    except Exception:
        WRITE_FAILURES.labels("receiver").inc()
        logger.exception(
            "jobs.dlq.receiver_failed: a dead letter could not be captured",
            extra={"event": "jobs.dlq.receiver_failed"},
        )


def on_task_failure(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    args: Any = None,
    kwargs: Any = None,
    einfo: Any = None,
    **_: Any,
) -> None:
    if not _enabled(sender) or exception is None:
        return
    if getattr(getattr(sender, "request", None), "is_eager", False):
        return  # eager calls raise to their caller; nothing was queued
    capture(sender.app, failure_letter, sender, task_id, exception, args, kwargs, einfo)


def on_task_revoked(
    sender: Any = None, request: Any = None, expired: bool = False, **_: Any
) -> None:
    if expired and _enabled(sender):
        capture(sender.app, expired_letter, sender, request)


def connect() -> None:
    """Connect the receivers once per process (they serve every jobs-platform app)."""
    signals.task_failure.connect(on_task_failure, weak=False, dispatch_uid="jobs.dlq.failure")
    signals.task_revoked.connect(on_task_revoked, weak=False, dispatch_uid="jobs.dlq.revoked")
