"""A queue item or message a worker refuses, as a ``poison`` dead letter (any broker).

The broker's transport screens what it fetches (on Redis:
:mod:`jobs_platform.brokers.redis.poison`) and hands each refusal here: one ERROR line
``jobs.dlq.poison`` names what was refused, and the dead letter goes through the same
capture as every other poison message (:func:`.hooks.capture`: the spool, then the
database through the drainer), with the item or message kept byte for byte. Poison Celery
itself recognises (unknown task, pickle, an undecodable body) is left to
:class:`.hooks.DeadLetterConsumer`.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import uuid
from collections.abc import Callable
from typing import Any

from celery import current_app, signals

from jobs_platform.deadletter.envelope import Refusal
from jobs_platform.deadletter.metrics import WRITE_FAILURES
from jobs_platform.deadletter.record import DeadLetter, clean_text
from jobs_platform.payload import DEFAULT_MAX_BYTES

logger = logging.getLogger("jobs_platform.deadletter")

EVENT = "jobs.dlq.poison"
JSON = "application/json"
#: Errors out of Celery's consumer that blame the message's data. Anything else (the
#: broker's connection errors, the pool, shutdown) propagates as it always did.
UNREADABLE_ERRORS: tuple[type[Exception], ...] = (LookupError, TypeError, ValueError)
#: How much of an item the CRITICAL line quotes when there is no app to record it.
_LOST_QUOTE_BYTES = 64 * 1024

# -- the worker this process serves ------------------------------------------------------------

_worker: dict[str, Any] = {}


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if getattr(app, "jobs_settings", None) is not None:
        _worker.update(app=app, hostname=getattr(sender, "hostname", None))


# Celery resolves the broker transport (importing this module) while it builds the worker,
# before worker_init; connected here so the transport needs no other wiring.
signals.worker_init.connect(_on_worker_init, weak=False, dispatch_uid="jobs.dlq.poison.worker")


def worker_app() -> tuple[Any, str | None]:
    """The jobs-platform app and node name of this worker (the app is None elsewhere).

    Without ``worker_init`` (a pool whose worker never loaded the transport early) the
    current app: Celery makes the worker's app current and default in every thread.
    """
    app = _worker.get("app")
    if app is None:
        current = current_app._get_current_object()
        app = current if getattr(current, "jobs_settings", None) is not None else None
    return app, _worker.get("hostname")


# -- dead letters ------------------------------------------------------------------------------


@dataclasses.dataclass
class RawItem:
    """A queue item in the shape :func:`.letters.poison_letter` reads: the item is its body."""

    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]
    delivery_info: dict[str, Any]
    content_type: str | None = None
    content_encoding: str | None = None


def raw_item_letter(
    item: bytes, queue: str, payload: Any, refusal: Refusal, hostname: str | None
) -> DeadLetter:
    """A dead letter of a refused item: the whole item as raw body, what it says of itself."""
    from jobs_platform.deadletter.letters import poison_letter

    fields = payload if isinstance(payload, dict) else {}
    headers = fields.get("headers")
    properties = fields.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    info = properties.get("delivery_info")
    exchange = info.get("exchange") if isinstance(info, dict) else None
    raw = RawItem(
        body=item,
        headers=headers if isinstance(headers, dict) else {},
        properties={k: properties.get(k) for k in ("correlation_id", "priority")},
        delivery_info={
            "routing_key": queue,
            "exchange": exchange if isinstance(exchange, str) else None,
        },
    )
    letter = poison_letter(raw, refusal.error_type, refusal.error, hostname)
    # Popped, so never redelivered: each refused item is its own row.
    return exact(dataclasses.replace(letter, chain=f"raw:{uuid.uuid4().hex}"), item)


def message_letter(message: Any, refusal: Refusal, hostname: str | None) -> DeadLetter:
    """A dead letter of a refused message: its body and headers, as the consumer records."""
    from jobs_platform.deadletter.letters import poison_letter

    letter = poison_letter(message, refusal.error_type, refusal.error, hostname)
    return exact(letter, message.body if isinstance(message.body, bytes) else b"")


def exact(letter: DeadLetter, raw: bytes) -> DeadLetter:
    """``letter`` with its raw body kept byte for byte: text the table would alter (a NUL,
    which the database cannot store) is kept as base64 instead."""
    text = letter.raw_body
    if letter.raw_body_encoding == "utf-8" and text is not None and clean_text(text) != text:
        encoded = base64.b64encode(raw).decode("ascii")
        return dataclasses.replace(letter, raw_body=encoded, raw_body_encoding="base64")
    return letter


def log_refusal(what: str, queue: str | None, size: int, refusal: Refusal, task_id: Any) -> None:
    logger.error(
        "%s: %s of %d bytes in queue %r refused (task_id=%s): %s: %s",
        EVENT,
        what,
        size,
        queue,
        task_id,
        refusal.error_type,
        refusal.error[:300],
        extra={
            "event": EVENT,
            "queue": queue,
            "error_type": refusal.error_type,
            "size_bytes": size,
            "task_id": task_id,
        },
    )


def record(build: Callable[..., DeadLetter], *args: Any, raw: bytes) -> None:
    """Hand the dead letter to the capture every poison message takes (never raises)."""
    app, hostname = worker_app()
    if app is None:
        WRITE_FAILURES.labels("lost").inc()
        logger.critical(
            "jobs.dlq.lost: a refused queue item could not be recorded (no jobs-platform app "
            "in this process); %d bytes, base64 of the first %d: %s",
            len(raw),
            _LOST_QUOTE_BYTES,
            base64.b64encode(raw[:_LOST_QUOTE_BYTES]).decode("ascii"),
            extra={"event": "jobs.dlq.lost"},
        )
        return
    from jobs_platform.deadletter.hooks import capture

    capture(app, build, *args, hostname, main_process=True)


def taken_in(message: Any) -> bool:
    """Whether Celery reserved the message's request before it failed (then it is not ours)."""
    from celery.worker import state

    task_id = message.headers.get("id")
    return isinstance(task_id, str) and task_id in state.requests


def max_payload_bytes() -> int:
    app, _ = worker_app()
    if app is None:
        return DEFAULT_MAX_BYTES
    settings = app.jobs_settings
    return int(settings.max_payload_bytes)
