"""Poison messages, and the worker-side request that lets every failure path be captured.

Celery's consumer logs and discards a message it cannot run: an unknown task name
(``on_unknown_task``), a message without a task header (``on_unknown_message``), a body
that does not decode (``on_decode_error``) or a content type that is not accepted, such as
pickle (``on_invalid_task``). :class:`DeadLetterConsumer` records each of them, raw body
included (base64 when it is not UTF-8), *before* Celery discards it. A pickle body is
never unpickled: only its bytes are kept.

It also gives every task the :class:`DeadLetterRequest` (unless the task chose its own
``Request`` class), which tells the receivers which message the main process is finishing.
Selected in code by :func:`jobs_platform.deadletter.install` (``worker_consumer``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

from celery.worker.consumer.consumer import Consumer
from celery.worker.request import Request

from jobs_platform import history
from jobs_platform.clock import utcnow
from jobs_platform.deadletter.receiver import capture, handling
from jobs_platform.deadletter.record import DeadLetter, row_id_or_none

logger = logging.getLogger("jobs_platform.deadletter")

DEFAULT_REQUEST = "celery.worker.request:Request"


class DeadLetterRequest(Request):  # type: ignore[misc]
    """Celery's Request, marking itself as current while it reports a failure or expiry."""

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        with handling(self):
            return super().on_failure(exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        with handling(self):
            return super().on_timeout(soft, timeout)

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any, expired: bool) -> Any:
        with handling(self):
            return super()._announce_revoked(reason, terminated, signum, expired)


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


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=repr))


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
        headers=_json_safe(headers),
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


def _type_name(exc: BaseException | None, default: str) -> str:
    if exc is None:
        return default
    return history.qualified_name(type(exc))


class DeadLetterConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, recording poison messages before it discards them."""

    def update_strategies(self) -> None:
        for task in self.app.tasks.values():
            if task.Request == DEFAULT_REQUEST or task.Request is Request:
                task.Request = DeadLetterRequest
        super().update_strategies()

    def _poison(self, message: Any, error_type: str, error: str) -> None:
        capture(
            self.app, poison_letter, message, error_type, error, self.hostname, main_process=True
        )

    def on_unknown_message(self, body: Any, message: Any) -> Any:
        self._poison(
            message,
            "jobs_platform.UnknownMessage",
            "message has no task header (not a Celery task message)",
        )
        return super().on_unknown_message(body, message)

    def on_unknown_task(self, body: Any, message: Any, exc: BaseException) -> Any:
        name = (message.headers or {}).get("task") if isinstance(message.headers, dict) else None
        self._poison(message, "celery.exceptions.NotRegistered", f"unknown task {name!r}")
        return super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: BaseException) -> Any:
        self._poison(message, _type_name(exc, "celery.exceptions.InvalidTaskError"), str(exc))
        return super().on_invalid_task(body, message, exc)

    def on_decode_error(self, message: Any, exc: BaseException) -> Any:
        self._poison(message, _type_name(exc, "kombu.exceptions.DecodeError"), str(exc))
        return super().on_decode_error(message, exc)
