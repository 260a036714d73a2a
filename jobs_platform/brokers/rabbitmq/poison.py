"""Bad input on RabbitMQ: rejected to the dead-letter exchange, recorded once by the drain.

A message no worker can run (not JSON, no ``task`` header, an unknown task, a body that does
not decode for its content type or is not accepted, such as pickle, headers or a body Celery
cannot read, arguments over ``JOBS_MAX_PAYLOAD_BYTES``) must become one ``poison`` dead
letter, and the worker must go on. Celery's consumer already *rejects* most of it
(``on_unknown_message``, ``on_unknown_task``, ``on_invalid_task``), but *acknowledges* a body
that does not decode (``on_decode_error``: gone without a trace), and a message whose
headers or body it cannot read raises out of its handler.

:class:`PoisonConsumer` makes every case a reject without requeue. Every work queue
dead-letters to :data:`.topology.DEAD_EXCHANGE`, so the broker moves the message, as it
arrived, to the dead queue, and the drain (:class:`.deadletters.DeadLetterDrain`) stores it
as ``poison`` before acknowledging it there: the message is never out of a replicated queue
before its row exists, and the worker's event loop never waits on a database. Nothing is
recorded here, so each message makes one row.

A worker that consumes a queue which does not dead-letter to the drain (declared by hand,
added at run time) cannot rely on that: there the consumer records the letter itself, as on
Redis (:class:`jobs_platform.deadletter.hooks.DeadLetterConsumer`: spool, then database),
and says so once.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable
from typing import Any

from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from jobs_platform import history
from jobs_platform.brokers.rabbitmq.deadletters import body_bytes, dead_letters_to_drain
from jobs_platform.brokers.rabbitmq.topology import DEAD_EXCHANGE
from jobs_platform.deadletter import envelope, rawpoison
from jobs_platform.deadletter.envelope import Refusal
from jobs_platform.deadletter.hooks import DeadLetterConsumer, capture
from jobs_platform.deadletter.letters import poison_letter
from jobs_platform.deadletter.record import DeadLetter

logger = logging.getLogger("jobs_platform.deadletter")

#: ``worker_consumer`` on the RabbitMQ broker (a string: only workers import it).
CONSUMER = "jobs_platform.brokers.rabbitmq.poison:PoisonConsumer"


def undrained_queues(app: Any) -> list[str]:
    """The queues this worker consumes that do not dead-letter to the drain."""
    consumed = app.amqp.queues.consume_from
    return sorted(name for name, queue in consumed.items() if not dead_letters_to_drain(queue))


def message_refusal(message: Any, max_bytes: int) -> Refusal | None:
    """What Celery's consumer would fail on in a task message (as the Redis guard checks),
    or None; Celery's own hooks see the rest (unknown task, undecodable, not accepted)."""
    headers = message.headers
    if not isinstance(headers, dict):
        return None
    body = body_bytes(message)
    decoded = envelope.decode_body(
        body,
        json_body=message.content_type == rawpoison.JSON and not headers.get("compression"),
        loads=kombu_loads,
    )
    size = envelope.oversize(body, decoded, max_bytes=max_bytes, dumps=kombu_dumps)
    if size is not None:
        return Refusal(
            envelope.PAYLOAD_TOO_LARGE,
            f"arguments of {size} bytes are over JOBS_MAX_PAYLOAD_BYTES ({max_bytes} bytes)",
        )
    problem = envelope.task_problem(headers, decoded)
    return None if problem is None else Refusal(envelope.UNREADABLE_MESSAGE, problem)


def worker_poison_letter(
    message: Any, error_type: str, error: str, hostname: str | None
) -> DeadLetter:
    """A poison letter recorded by the worker (a queue the drain does not see).

    RabbitMQ's delivery tags count from 1 on every channel, so the tag cannot key the row
    (as it does on Redis): a job's task id does, and a message without one is its own row
    (it is acknowledged or rejected once recorded, never delivered again).
    """
    letter = poison_letter(message, error_type, error, hostname)
    letter = rawpoison.exact(letter, body_bytes(message))
    headers = message.headers if isinstance(message.headers, dict) else {}
    enqueued = headers.get(history.ENQUEUED_HEADER)
    chain = str(enqueued or "") if letter.task_id else f"amqp-worker:{uuid.uuid4().hex}"
    return dataclasses.replace(letter, chain=chain)


class PoisonConsumer(DeadLetterConsumer):
    """Celery's consumer on RabbitMQ: bad input is rejected to the dead-letter exchange."""

    _jobs_warned = False

    def _jobs_drained(self) -> bool:
        """Whether every queue this worker consumes dead-letters to the drain."""
        undrained = undrained_queues(self.app)
        if undrained and not self._jobs_warned:
            self._jobs_warned = True
            logger.error(
                "jobs.dlq.undrained_queues: queues %s do not dead-letter to %r; this worker "
                "records bad input itself (as on Redis) instead of leaving it to the drain",
                ", ".join(undrained),
                DEAD_EXCHANGE,
                extra={"event": "jobs.dlq.undrained_queues"},
            )
        return not undrained

    def _poison(self, message: Any, error_type: str, error: str) -> None:
        # Celery's hook rejects the message next; the drain records it from the dead queue.
        if self._jobs_drained():
            return
        capture(
            self.app,
            worker_poison_letter,
            message,
            error_type,
            error,
            self.hostname,
            main_process=True,
        )

    def on_decode_error(self, message: Any, exc: BaseException) -> Any:
        if not self._jobs_drained():
            return super().on_decode_error(message, exc)  # recorded, then acknowledged
        logger.error(
            "%s: message of %d bytes refused (it does not decode: %s: %s); rejected to %r",
            rawpoison.EVENT,
            len(body_bytes(message)),
            type(exc).__name__,
            str(exc)[:300],
            DEAD_EXCHANGE,
            extra={"event": rawpoison.EVENT},
        )
        # Celery acknowledges here, and the message would vanish: rejected, the broker
        # dead-letters it and the drain records it.
        message.reject_log_error(logger, self.connection_errors)
        return None

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        handle = super().create_task_handler(*args, **kwargs)
        max_bytes = int(self.app.jobs_settings.max_payload_bytes)

        def screened(message: Any) -> Any:
            refusal = message_refusal(message, max_bytes)
            if refusal is None:
                try:
                    return handle(message)
                except rawpoison.UNREADABLE_ERRORS as exc:
                    if rawpoison.taken_in(message):
                        raise  # Celery's accounting is half done: its own handling
                    refusal = Refusal(
                        envelope.UNREADABLE_MESSAGE,
                        f"Celery could not read the message: {type(exc).__name__}: {exc}",
                    )
            self._jobs_refuse(message, refusal)
            return None

        return screened

    def _jobs_refuse(self, message: Any, refusal: Refusal) -> None:
        headers = message.headers if isinstance(message.headers, dict) else {}
        queue = (message.delivery_info or {}).get("routing_key")
        size = len(body_bytes(message))
        rawpoison.log_refusal("message", queue, size, refusal, headers.get("id"))
        if message.acknowledged:
            return
        if self._jobs_drained():
            message.reject_log_error(logger, self.connection_errors)
            return
        capture(
            self.app,
            worker_poison_letter,
            message,
            refusal.error_type,
            refusal.error,
            self.hostname,
            main_process=True,
        )
        message.ack_log_error(logger, self.connection_errors)


def install(app: Any) -> None:
    """Make ``app``'s workers reject bad input to the drain (``worker_consumer``)."""
    app.conf.worker_consumer = CONSUMER
