"""A :class:`~.record.DeadLetter` built from what Celery knows when a job dies.

:func:`failure_letter` (``task_failure``: exhausted retries, permanent errors, hard time
limits, workers lost beyond their cap, ``Reject(requeue=False)``), :func:`expired_letter`
(``task_revoked(expired=True)``) and :func:`poison_letter` (a message the consumer cannot
run). No side effect here: :mod:`.hooks` decides when to build one and where it goes.

Some signals fire in the pool child (``sender.request`` is the task's context) and some in
the worker's main process, where Celery leaves ``sender.request`` empty; there the hooks
pass the worker ``Request`` being finished (``finishing``), so every path sees the
message's headers, queue and history.

The exception ``task_failure`` receives is not always the one the task raised: Celery swaps
one it cannot pickle (urllib's ``HTTPError``, httpx's ``HTTPStatusError``) for a stand-in
such as ``OSError()``. When :class:`~jobs_platform.task.ReliableTask` gives up it notes its
decision on the task's request (a :class:`jobs_platform.history.FinalFailure`: outcome, the
error as raised, its HTTP status), and that note wins: the reason is the decision's outcome,
never derived again.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.app.task import Context
from celery.exceptions import Reject

from jobs_platform import arguments, history
from jobs_platform.clock import utcnow
from jobs_platform.deadletter.record import DeadLetter, parse_time, row_id_or_none
from jobs_platform.retry.classify import http_status


@dataclasses.dataclass
class Origin:
    """What the worker knew about the message when the job died."""

    headers: dict[str, Any]
    delivery_info: dict[str, Any]
    hostname: str | None
    retries: int
    args: Any = None
    kwargs: Any = None
    #: The give-up ReliableTask recorded on the task's request (pool child only).
    failure: history.FinalFailure | None = None
    #: The canvas around the job (:func:`canvas_links`), if it is in one.
    canvas: dict[str, Any] | None = None
    #: The step a chain or link would have run next (a signature dict), if any.
    next_step: Any = None


def origin_of(sender: Any, task_id: str | None, finishing: Any = None) -> Origin:
    """From the worker ``Request`` being finished (main process) or the task's context."""
    if finishing is not None and finishing.id == task_id:
        data = dict(finishing.request_dict)
        return Origin(
            headers=dict(Context(data).headers or {}),
            delivery_info=dict(finishing.delivery_info or {}),
            hostname=finishing.hostname,
            retries=int(data.get("retries") or 0),
            args=finishing.args,
            kwargs=finishing.kwargs,
            canvas=canvas_links(data, finishing.id),
            next_step=next_step_of(data),
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
            canvas=canvas_links(vars(context), task_id),
            next_step=next_step_of(vars(context)),
        )
    return Origin(headers={}, delivery_info={}, hostname=None, retries=0)


# -- canvas: the group, chord and chain a job belongs to ------------------------------------


def _brief(signature: Any) -> dict[str, Any]:
    """``{"id", "task"}`` of a signature (a dict as Celery sends it, or a Signature)."""
    if not isinstance(signature, Mapping):
        return {"id": None, "task": str(signature)}
    options = signature.get("options") or {}
    return {"id": options.get("task_id"), "task": signature.get("task")}


def canvas_links(data: Mapping[str, Any], task_id: str | None) -> dict[str, Any] | None:
    """The canvas a job sits in, from its request (``group``, ``chord``, ``callbacks``,
    ``chain``, ``root_id``, ``parent_id``), or ``None`` for a job in none."""
    links: dict[str, Any] = {}
    if data.get("group"):
        links["group"] = data["group"]
        if data.get("group_index") is not None:
            links["group_index"] = data["group_index"]
    if data.get("chord"):
        links["chord_callback"] = _brief(data["chord"])
    if data.get("callbacks"):
        links["callbacks"] = [_brief(s) for s in data["callbacks"]]
    chain = data.get("chain")
    if chain and isinstance(chain, list):
        # Celery keeps the remainder last-step-first (it pops the next one off the end).
        links["chain_remainder"] = [_brief(s) for s in reversed(chain)]
    if not links:
        return None
    for key in ("root_id", "parent_id"):
        if data.get(key) and data[key] != task_id:
            links[key] = data[key]
    return links


def next_step_of(data: Mapping[str, Any]) -> Any:
    """The signature the job's success would have sent next: its chain's next step, else its
    first link; ``None`` when nothing follows it (a chord's callback is the backend's)."""
    chain = data.get("chain")
    if chain and isinstance(chain, list):
        return chain[-1]
    callbacks = data.get("callbacks")
    if callbacks and isinstance(callbacks, list):
        return callbacks[0]
    return None


def upstream_letter(
    app: Any,
    signature: Any,
    *,
    error_type: str,
    error: str,
    links: dict[str, Any],
    worker: str | None,
) -> DeadLetter:
    """The dead letter of a chain step or chord callback that will never run because a job
    before it died (reason ``upstream_failed``). Its args are the step's own partial ones:
    the input it was waiting for never came."""
    options = dict(signature.get("options") or {})
    name = str(signature.get("task") or "")
    task = app.tasks.get(name)
    queue = options.get("queue") or getattr(task, "queue_class", None) or ""
    remainder = options.get("chain")
    if remainder and isinstance(remainder, list):
        links = {**links, "chain_remainder": [_brief(s) for s in reversed(remainder)]}
    if options.get("link"):
        links = {**links, "callbacks": [_brief(s) for s in options["link"]]}
    return DeadLetter(
        reason="upstream_failed",
        task_id=options.get("task_id"),
        task_name=name,
        queue=str(getattr(queue, "name", queue)),
        errors=[history.entry(error_type, error, 0)],
        failed_at=utcnow(),
        args=arguments.to_stored(_as_given(signature.get("args") or [], list)),
        kwargs=arguments.to_stored(_as_given(signature.get("kwargs") or {}, dict)),
        headers=arguments.to_stored({history.CANVAS_HEADER: links}),
        priority=options.get("priority"),
        attempts=0,
        worker=worker,
        chain="upstream_failed",  # one letter per step, however often its upstream dies
    )


def reason_for(exc: BaseException, failure: history.FinalFailure | None = None) -> str:
    """The dead-letter reason: ReliableTask's own outcome when it gave up; otherwise what
    Celery's exception says (the paths where no give-up decision was made)."""
    if failure is not None:
        return failure.outcome
    if isinstance(exc, TimeLimitExceeded):
        return "time_limit"
    if isinstance(exc, WorkerLostError):
        return "worker_lost"
    if isinstance(exc, Reject):
        return "rejected"
    return "permanent"  # a plain task that failed and will not be retried


def final_entry(
    exc: BaseException, failure: history.FinalFailure | None, attempt: int
) -> dict[str, Any]:
    """The last error of the history, with its HTTP ``status`` when there is one."""
    if failure is not None:
        return failure.entry()
    entry = history.describe(exc, attempt)
    status = http_status(exc)  # a plain task's exception (no decision read it), if Celery kept it
    if status is not None:
        entry["status"] = status
    return entry


def _as_given(value: Any, kind: type[list[Any]] | type[dict[Any, Any]]) -> Any:
    """A copy of ``value`` as ``kind`` when it is one (a tuple is a list), else as given.

    Arguments a task died of are not always a list and a mapping: a message from another
    producer (or an unscreened broker) can carry a string, a number or an object, and the
    call failed on exactly that. ``list("abc")`` would store something that never was,
    ``list(5)`` would raise and lose the dead letter: keep what the message held.
    """
    if kind is list and isinstance(value, list | tuple):
        return list(value)
    if kind is dict and isinstance(value, Mapping):
        return dict(value)
    return value


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
    stored = {k: v for k, v in headers.items() if k != history.ERRORS_HEADER}
    if origin.canvas:
        stored[history.CANVAS_HEADER] = origin.canvas
    return DeadLetter(
        reason=reason,
        task_id=task_id,
        task_name=str(task.name),
        queue=str(delivery.get("routing_key") or getattr(task, "queue_class", "") or ""),
        errors=errors,
        failed_at=utcnow(),
        args=arguments.to_stored(_as_given(args, list)),
        kwargs=arguments.to_stored(_as_given(kwargs, dict)),
        headers=arguments.to_stored(stored),
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


def failure_letter(
    sender: Any,
    task_id: str | None,
    exc: BaseException,
    args: Any,
    kwargs: Any,
    einfo: Any,
    finishing: Any = None,
) -> DeadLetter:
    origin = origin_of(sender, task_id, finishing)
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


def expired_letter(sender: Any, request: Any, finishing: Any = None) -> DeadLetter:
    task_id = getattr(request, "id", None)
    origin = origin_of(sender, task_id, finishing)
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


# -- poison messages: never became a task -------------------------------------------------


def raw_body(message: Any) -> tuple[str | None, str | None]:
    """The body as stored: ``(text, "utf-8")`` or ``(base64, "base64")``."""
    body = getattr(message, "body", None)
    if body is None:
        return None, None
    if isinstance(body, str):
        return body, "utf-8"
    data = bytes(body)
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _decoded_call(message: Any) -> tuple[Any, Any]:
    """args/kwargs of a JSON task message (so a replay works once the task exists)."""
    if getattr(message, "content_type", None) != "application/json":
        return None, None  # never decode anything else: pickle would run code
    try:
        payload = json.loads(message.body)
    except (TypeError, ValueError, binascii.Error):
        return None, None
    if isinstance(payload, list) and len(payload) >= 2:
        args, kwargs = payload[0], payload[1]
        if isinstance(args, list) and isinstance(kwargs, dict):
            return args, kwargs
    return None, None


def poison_letter(message: Any, error_type: str, error: str, hostname: str | None) -> DeadLetter:
    """The raw message as it arrived (base64 body when not UTF-8; pickle never unpickled)."""
    headers = message.headers if isinstance(getattr(message, "headers", None), dict) else {}
    properties = getattr(message, "properties", None) or {}
    delivery = getattr(message, "delivery_info", None) or {}
    text, encoding = raw_body(message)
    args, kwargs = _decoded_call(message)
    task_id = headers.get("id") or properties.get("correlation_id")
    tag = properties.get("delivery_tag") or delivery.get("delivery_tag") or ""
    replay_of = headers.get(history.REPLAY_OF_HEADER)
    return DeadLetter(
        reason="poison",
        task_id=str(task_id) if task_id else None,
        task_name=str(headers.get("task") or ""),
        queue=str(delivery.get("routing_key") or ""),
        errors=[history.entry(error_type, error, 1)],
        failed_at=utcnow(),
        args=args,
        kwargs=kwargs,
        headers=arguments.to_stored(headers),
        priority=properties.get("priority") or delivery.get("priority"),
        exchange=delivery.get("exchange"),
        routing_key=delivery.get("routing_key"),
        raw_body=text,
        raw_body_encoding=encoding,
        content_type=getattr(message, "content_type", None),
        content_encoding=getattr(message, "content_encoding", None),
        attempts=0,
        worker=hostname,
        replay_of=row_id_or_none(replay_of),
        chain=str(headers.get(history.ENQUEUED_HEADER) or tag),
    )
