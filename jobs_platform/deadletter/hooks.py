"""Where Celery hands the platform a dead job: signal receivers, the consumer, the request.

Every terminal path ends in :func:`capture`, which builds the dead letter
(:mod:`.letters`) and hands it to the sink (:mod:`.sink`):

- ``task_failure``: exhausted retries, permanent errors, hard time limits, workers lost
  beyond their cap, ``Reject(requeue=False)``;
- ``task_revoked(expired=True)``: expired messages;
- :class:`DeadLetterConsumer`: poison messages (an unknown task name, no task header, a
  body that does not decode, a content type that is not accepted such as pickle),
  recorded before Celery discards them (``worker_consumer``, see
  :data:`jobs_platform.deadletter.CONSUMER`).

Some of these run in the worker's main process: there :class:`DeadLetterRequest` marks the
request it is finishing (a thread-local), so that the letter sees the message's headers and
history, and the database write is handed to the drainer thread (:mod:`.drainer`): the
consumer's event loop never waits on a database.

Receivers never raise (Celery would only log it): a failure here is logged at ERROR with
its traceback and counted as ``jobs_dead_letter_write_failures_total{stage="receiver"}``.
SQLAlchemy is imported only when a job dies or a pool process starts, never at
``import jobs_platform``.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from celery import signals
from celery.worker.consumer.consumer import Consumer
from celery.worker.request import Request

from jobs_platform import arguments, checkpoints, history, process_local
from jobs_platform.deadletter.letters import (
    canvas_links,
    expired_letter,
    failure_letter,
    origin_of,
    poison_letter,
    upstream_letter,
)
from jobs_platform.deadletter.metrics import WRITE_FAILURES
from jobs_platform.deadletter.record import DeadLetter

logger = logging.getLogger("jobs_platform.deadletter")

DEFAULT_REQUEST = "celery.worker.request:Request"

_local = threading.local()

#: True in a prefork pool process (set by ``worker_process_init``, which only they send).
_pool_process = False


@contextmanager
def finishing(request: Any) -> Iterator[None]:
    """Mark ``request`` (a worker ``Request``) as the one this thread is finishing."""
    previous = getattr(_local, "request", None)
    _local.request = request
    try:
        yield
    finally:
        _local.request = previous


def _current_request() -> Any:
    return getattr(_local, "request", None)


def capture(
    app: Any,
    build: Callable[..., DeadLetter | None],
    *build_args: Any,
    main_process: bool = False,
) -> None:
    """Build a dead letter and hand it to the sink; raises nothing but a SIGTERM's exit.

    In the worker's main process (``main_process``, or while it finishes a request) the
    database write is handed to the drainer thread, woken at once. In a pool process a
    SIGTERM takes effect only once the letter is stored (:func:`terminate_after`).
    """
    try:
        # SQLAlchemy (through the sink): on failure only.
        from jobs_platform.deadletter.drainer import wake
        from jobs_platform.deadletter.sink import sink_for

        in_main = main_process or _current_request() is not None
        letter = build(*build_args)
        if letter is None:
            return
        with terminate_after(not in_main):
            sink_for(app).capture(letter, handoff=wake if in_main else None)
    except Exception:
        WRITE_FAILURES.labels("receiver").inc()
        logger.exception(
            "jobs.dlq.receiver_failed: a dead letter could not be captured",
            extra={"event": "jobs.dlq.receiver_failed"},
        )


@contextmanager
def terminate_after(enabled: bool = True) -> Iterator[None]:
    """In a prefork pool process, hold a SIGTERM that arrives inside the block and deliver
    it again at its end.

    Celery stops a pool process with SIGTERM (a cancel when the broker connection is lost,
    ``revoke(terminate=True)``, a hard time limit before its SIGKILL), and billiard turns it
    into ``SystemExit`` wherever the process is. Inside the dead letter's database write the
    interrupted transaction's rollback can fail and replace it with a database error: the
    letter was dropped (``jobs.dlq.lost``) and the process lived on to report the failure,
    whose message was then acknowledged. Held, the signal stops the process once the letter
    is stored (the message, not acknowledged, is delivered again: at least once).
    """
    if not (enabled and _pool_process) or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is None:  # installed outside Python: it could not be put back
        yield
        return
    held: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if held:
            os.kill(os.getpid(), signal.SIGTERM)  # its own handler now (billiard: SystemExit)


# -- signal receivers -----------------------------------------------------------------------


def _enabled(sender: Any) -> bool:
    app = getattr(sender, "app", None)
    return app is not None and getattr(app, "jobs_settings", None) is not None


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
    finishing_request = _current_request()
    capture(
        sender.app,
        _failure_with_checkpoint,
        sender,
        task_id,
        exception,
        args,
        kwargs,
        einfo,
        finishing_request,
    )
    capture(sender.app, _next_step_letter, sender, task_id, exception, finishing_request)


def _failure_with_checkpoint(
    sender: Any,
    task_id: str | None,
    exc: BaseException,
    args: Any,
    kwargs: Any,
    einfo: Any,
    finishing_request: Any,
) -> DeadLetter:
    """The job's dead letter, with its last checkpoint in the headers (a replay resumes)."""
    letter = failure_letter(sender, task_id, exc, args, kwargs, einfo, finishing_request)
    if task_id:
        try:
            value = checkpoints.peek(sender.app, task_id)
        except Exception as exc_read:
            # The letter matters more than its checkpoint: stored without it (a replay
            # starts from the header the message carried, if any).
            logger.warning(
                "%s[%s]: its checkpoint could not be read for the dead letter: %r",
                sender.name,
                task_id,
                exc_read,
                extra={"event": "jobs.checkpoint.read_failed", "task_id": task_id},
            )
            value = None
        if value is not None:
            letter.headers = {**(letter.headers or {}), checkpoints.HEADER: value}
            letter.headers = arguments.to_stored(letter.headers)
    return letter


def _next_step_letter(
    sender: Any, task_id: str | None, exc: BaseException, finishing_request: Any
) -> DeadLetter | None:
    """A chain step (or link) the dead job would have sent: ``upstream_failed``."""
    origin = origin_of(sender, task_id, finishing_request)
    if origin.next_step is None:
        return None
    links = {"upstream": task_id, **(origin.canvas or {})}
    if links.get("chain_remainder"):
        links["chain_remainder"] = links["chain_remainder"][1:]  # the first is this step
        if not links["chain_remainder"]:
            del links["chain_remainder"]
    links.pop("callbacks", None)  # the step itself, when it was a link
    return upstream_letter(
        sender.app,
        origin.next_step,
        error_type=history.qualified_name(type(exc)),
        error=f"not run: the job before it in its chain ({sender.name}[{task_id}]) died: {exc}",
        links=links,
        worker=origin.hostname,
    )


# -- a chord whose callback will not run --------------------------------------------------


def on_chord_error(backend: Any, callback: Any, exc: BaseException | None) -> None:
    """Celery gives up a chord's callback (a header member died, or the callback could not
    be sent): its dead letter, ``upstream_failed``, once per callback (its task id)."""
    app = getattr(backend, "app", None)
    if app is None or getattr(app, "jobs_settings", None) is None:
        return
    member = _member_data()
    links = canvas_links(member, None) or {}
    links.pop("chain_remainder", None)
    links.pop("callbacks", None)
    steps = list(getattr(callback, "tasks", None) or [callback])  # a group body: each task
    for step in steps:
        build = functools.partial(
            upstream_letter,
            app,
            step,
            error_type=history.qualified_name(type(exc)) if exc else "celery.exceptions.ChordError",
            error=f"chord callback not run: {exc}",
            links=links,
            worker=member.get("hostname"),
        )
        capture(app, build)


def _member_data() -> dict[str, Any]:
    """The request of the chord member being finished (the one that settled the chord)."""
    finishing_request = _current_request()
    if finishing_request is not None:
        return dict(finishing_request.request_dict)
    from celery import current_task

    task = current_task._get_current_object() if current_task else None
    request = getattr(task, "request", None)
    return dict(vars(request)) if request is not None else {}


def install_chord_hook() -> None:
    """Route Celery's one chord-failure funnel (every result backend calls
    ``Backend.chord_error_from_stack``) through :func:`on_chord_error` (idempotent)."""
    from celery.backends.base import Backend

    original = Backend.chord_error_from_stack
    if getattr(original, "jobs_hooked", False):
        return

    def chord_error_from_stack(self: Any, callback: Any, exc: Any = None) -> Any:
        if exc is None:
            exc = sys.exc_info()[1]
        try:
            on_chord_error(self, callback, exc)
        except Exception:
            logger.exception(
                "jobs.dlq.receiver_failed: a chord callback's dead letter could not be built",
                extra={"event": "jobs.dlq.receiver_failed"},
            )
        return original(self, callback, exc)

    chord_error_from_stack.jobs_hooked = True  # type: ignore[attr-defined]
    Backend.chord_error_from_stack = chord_error_from_stack


def on_task_revoked(
    sender: Any = None, request: Any = None, expired: bool = False, **_: Any
) -> None:
    if expired and _enabled(sender):
        capture(sender.app, expired_letter, sender, request, _current_request())


def on_worker_process_init(**_: Any) -> None:
    """A new pool process: drop what it inherited (engines, clients), load the capture path."""
    global _pool_process
    _pool_process = True
    process_local.forget_inherited()
    # Now, not on the child's first failing task.
    importlib.import_module("jobs_platform.deadletter.drainer")


def connect() -> None:
    """Connect the receivers once per process (they serve every jobs-platform app)."""
    signals.task_failure.connect(on_task_failure, weak=False, dispatch_uid="jobs.dlq.failure")
    signals.task_revoked.connect(on_task_revoked, weak=False, dispatch_uid="jobs.dlq.revoked")
    signals.worker_process_init.connect(
        on_worker_process_init, weak=False, dispatch_uid="jobs.forget_inherited"
    )
    install_chord_hook()


# -- the worker's main process --------------------------------------------------------------


class DeadLetterRequest(Request):  # type: ignore[misc]
    """Celery's Request, marking itself as being finished while it reports a failure or
    an expiry (the receivers then run in the main process, with ``sender.request`` empty)."""

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        with finishing(self):
            return super().on_failure(exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> Any:
        with finishing(self):
            return super().on_timeout(soft, timeout)

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any, expired: bool) -> Any:
        with finishing(self):
            return super()._announce_revoked(reason, terminated, signum, expired)

    # -- cancelled on a broker connection loss: redelivered, never acknowledged ------------
    #
    # Celery cancels the running acks-late jobs when the broker connection drops
    # (worker_cancel_long_running_tasks_on_connection_loss), and the message must then come
    # back. Two of its paths acknowledged it instead, losing the job with no dead letter:
    # - prefork: the cancel writes a RETRY state to the result backend before it marks the
    #   request cancelled; with the backend down too (often the same Redis) the write
    #   raises, and the child's death is then taken for a revoke, which acknowledges;
    # - gevent/eventlet: the killed greenlet returns Celery's "killed" result, (False, None,
    #   None), which the request takes for a success and acknowledges.

    _jobs_killed_green = False

    def cancel(self, pool: Any, signal: Any = None, emit_retry: bool = True) -> Any:
        # Marked before anything can fail, and also when the job has not started yet (its
        # termination then comes from the pool's outbound queue, with no announcement).
        self._already_cancelled = True
        if self.time_start and getattr(pool, "is_green", False):
            self._jobs_killed_green = True
        return super().cancel(pool, signal, emit_retry=emit_retry)

    def _announce_cancelled(self, emit_retry: bool = True) -> Any:
        self._already_cancelled = True
        try:
            return super()._announce_cancelled(emit_retry=emit_retry)
        except Exception as exc:
            # Only the announcement is lost (a RETRY state, task_retry): the message stays
            # unacknowledged and the broker delivers it again.
            logger.warning(
                "%s[%s]: cancelled after the broker connection was lost; the retry could "
                "not be announced (%r); the message stays unacknowledged for redelivery",
                self.task_name,
                self.id,
                exc,
                extra={"event": "jobs.broker.cancel_unannounced", "task_id": self.id},
            )
            return None

    def acknowledge(self) -> None:
        if self._jobs_killed_green and not self.acknowledged:
            # The "success" of a greenlet killed by the cancel (a job that finished in the
            # instant before the kill runs again: at least once).
            logger.warning(
                "%s[%s]: killed when the broker connection was lost; the message stays "
                "unacknowledged for redelivery",
                self.task_name,
                self.id,
                extra={"event": "jobs.broker.cancel_kept", "task_id": self.id},
            )
            return
        super().acknowledge()


def _type_name(exc: BaseException | None, default: str) -> str:
    if exc is None:
        return default
    return history.qualified_name(type(exc))


class DeadLetterConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer, recording poison messages before it discards them.

    It also gives every task the :class:`DeadLetterRequest`, unless the task chose its own
    ``Request`` class.
    """

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
