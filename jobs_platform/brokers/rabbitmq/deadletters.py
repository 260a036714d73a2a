"""What RabbitMQ dead-letters becomes one row of the SQL dead-letter table.

Every work queue is a quorum queue that dead-letters to the fanout exchange
:data:`DEAD_EXCHANGE` (``x-dead-letter-strategy: at-least-once``, ``x-overflow:
reject-publish``, ``x-delivery-limit``: :func:`dead_lettering_arguments`); the exchange feeds
one durable quorum queue, :data:`DEAD_QUEUE`. The broker moves a message there when it was
delivered more often than the limit (a job that keeps killing its worker), when its TTL ran
out in the queue, when a consumer rejected it without requeue (a task's
``Reject(requeue=False)``, and every piece of bad input: :mod:`.poison` rejects it), or when
a queue with a length limit dropped it. **No Celery signal fires on that path**: the broker
does it alone, so a table fed by ``task_failure`` would miss it.

:class:`DeadLetterDrain` is a worker bootstep with a kombu consumer of its own (its own
connection and thread: the worker's consumer never waits on it, and it reconnects with a
backoff when the broker goes away). For each dead message it builds the dead letter
(:func:`letters_of`, from the message's headers, its body decoded as Celery would, and the
broker's ``x-death`` record) and acknowledges the message only once the letter is kept
(:func:`keep`): written to the table, or spooled for the drainer when the database is down.
Until then the message stays unacknowledged in the dead queue and the drain retries, so a
crash anywhere loses nothing; the message is then delivered again (at least once) and the
table's UNIQUE ``dedupe_key`` makes the second write a no-op. Every worker runs a drain:
several consumers on one queue share its messages, and the same UNIQUE settles any overlap.

The reason (:data:`REASONS`): ``delivery_limit`` -> ``worker_lost``, ``expired`` ->
``expired``, ``rejected`` -> ``rejected``, ``maxlen`` -> ``rejected``; and whatever the broker
said, a message no worker could ever run (not decodable, not a task message, an unknown task,
unreadable to Celery, over ``JOBS_MAX_PAYLOAD_BYTES``: :func:`refusal_of`) -> ``poison``.

A job's dead letter has the same ``dedupe_key`` whichever path reports it (task id and first
enqueue time, as :mod:`jobs_platform.deadletter.letters` builds it), so a job that Celery
reports too (a ``Reject(requeue=False)`` fires ``task_failure`` and is dead-lettered) is one
row. A message with no task id is keyed by its content and its ``x-death`` record, which a
redelivery from the dead queue does not change.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import logging
import threading
from collections.abc import Mapping
from typing import Any

from celery import bootsteps
from kombu import Connection, Consumer, Exchange, Queue
from kombu.serialization import loads as kombu_loads
from kombu.serialization import prepare_accept_content
from kombu.utils.json import dumps as kombu_dumps

from jobs_platform import arguments, history
from jobs_platform.brokers.rabbitmq import topology
from jobs_platform.brokers.rabbitmq.topology import DEAD_EXCHANGE, DEAD_QUEUE
from jobs_platform.clock import as_utc, utc_iso, utcnow
from jobs_platform.deadletter import envelope, rawpoison
from jobs_platform.deadletter.envelope import Refusal
from jobs_platform.deadletter.letters import (
    canvas_links,
    next_step_of,
    poison_letter,
    upstream_letter,
)
from jobs_platform.deadletter.record import DeadLetter, parse_time, row_id_or_none

logger = logging.getLogger("jobs_platform.deadletter")

#: The bootstep, by name (only workers import it).
STEP = "jobs_platform.brokers.rabbitmq.deadletters:DeadLetterDrain"

#: Why the broker dead-lettered a message (``x-death`` reason) -> the dead letter's reason.
REASONS: dict[str, str] = {
    "delivery_limit": "worker_lost",
    "expired": "expired",
    "rejected": "rejected",
    "maxlen": "rejected",
}
#: The error type of each (stable names: ``dlq stats`` groups by them).
ERROR_TYPES: dict[str, str] = {
    "delivery_limit": "jobs_platform.DeliveryLimitExceeded",
    "expired": "jobs_platform.MessageExpired",
    "rejected": "jobs_platform.MessageRejected",
    "maxlen": "jobs_platform.QueueOverflow",
}
UNKNOWN_DEATH = "jobs_platform.DeadLettered"
UNKNOWN_MESSAGE = "jobs_platform.UnknownMessage"
NOT_REGISTERED = "celery.exceptions.NotRegistered"

#: RabbitMQ's own headers about a message's deaths and deliveries. Kept out of the stored
#: headers (a replay sends those again, and they describe the broker's past, not the job):
#: the death goes into the final error entry instead.
BROKER_HEADERS = frozenset(
    {
        "x-death",
        "x-delivery-count",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-first-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
        "x-last-death-exchange",
    }
)
#: Headers a redelivery from the dead queue changes (left out of a content key).
_PER_DELIVERY = frozenset({"x-delivery-count"})

#: Unacknowledged dead messages one drain holds at a time.
PREFETCH = 16
#: How long one wait for a dead message lasts (the stop flag and heartbeats are checked
#: between waits).
POLL_S = 1.0
#: Backoff between reconnects, and between attempts to keep a letter (doubling).
BACKOFF_MIN_S = 0.5
BACKOFF_MAX_S = 10.0


# -- the topology the drain relies on -----------------------------------------------------


def dead_lettering_arguments(delivery_limit: int) -> dict[str, Any]:
    """The ``queue_arguments`` of a work queue whose dead messages the drain records."""
    return topology.work_queue_arguments(delivery_limit)


def dead_exchange() -> Exchange:
    return Exchange(DEAD_EXCHANGE, type=topology.DEAD_EXCHANGE_TYPE, durable=True)


def dead_queue() -> Queue:
    return Queue(
        DEAD_QUEUE,
        dead_exchange(),
        durable=True,
        queue_arguments=topology.dead_queue_arguments(),
    )


def dead_letters_to_drain(queue: Queue) -> bool:
    """Whether ``queue`` dead-letters to the drain's exchange."""
    return (queue.queue_arguments or {}).get("x-dead-letter-exchange") == DEAD_EXCHANGE


def declare(channel: Any) -> None:
    """Declare the dead-letter exchange and queue (idempotent)."""
    dead_exchange()(channel).declare()
    dead_queue()(channel).declare()


def declare_now(app: Any) -> bool:
    """Declare them over a short connection of their own; whether it worked (if not, the
    drain's thread declares them when it connects)."""
    try:
        with app.connection_for_write(connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
            declare(conn.default_channel)
    except Exception as exc:
        logger.warning(
            "jobs.dlq.drain_declare_failed: %r and %r not declared at start (%s: %s); the "
            "drain declares them when it reaches the broker",
            DEAD_EXCHANGE,
            DEAD_QUEUE,
            type(exc).__name__,
            exc,
            extra={"event": "jobs.dlq.drain_declare_failed"},
        )
        return False
    return True


# -- one dead message -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Death:
    """The broker's newest ``x-death`` entry: why and where the message died."""

    reason: str
    queue: str
    exchange: str | None
    routing_key: str | None
    time: dt.datetime | None
    #: The message's own TTL (ms, as a string) when it expired of it.
    original_expiration: str | None = None

    def entry(self) -> dict[str, Any]:
        """The death as stored in the final error entry (JSON)."""
        data: dict[str, Any] = {"reason": self.reason, "queue": self.queue}
        data["exchange"] = self.exchange
        data["routing_key"] = self.routing_key
        data["time"] = utc_iso(self.time) if self.time else None
        if self.original_expiration is not None:
            data["original_expiration_ms"] = self.original_expiration
        return data


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def death_of(headers: Mapping[str, Any], fallback_queue: str | None = None) -> Death:
    """The newest death of a dead message (``x-death`` lists the newest first)."""
    deaths = headers.get("x-death")
    newest = deaths[0] if isinstance(deaths, list) and deaths else {}
    newest = newest if isinstance(newest, Mapping) else {}
    keys = newest.get("routing-keys")
    moment = newest.get("time")
    return Death(
        reason=_text(newest.get("reason")) or _text(headers.get("x-first-death-reason")) or "",
        queue=_text(newest.get("queue"))
        or _text(headers.get("x-first-death-queue"))
        or fallback_queue
        or "",
        exchange=_text(newest.get("exchange")),
        routing_key=_text(keys[0]) if isinstance(keys, list) and keys else None,
        time=as_utc(moment) if isinstance(moment, dt.datetime) else None,
        original_expiration=_text(newest.get("original-expiration")),
    )


@dataclasses.dataclass(frozen=True)
class Call:
    """A dead message read as a task call (protocol 2; protocol 1 normalised to it)."""

    headers: dict[str, Any]
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]


def body_bytes(message: Any) -> bytes:
    """The body as it arrived: py-amqp hands a body with a ``content_encoding`` over as the
    decoded text (and one that does not decode as bytes)."""
    body = message.body
    if isinstance(body, bytes):
        return body
    if isinstance(body, bytearray | memoryview):
        return bytes(body)
    return b"" if body is None else str(body).encode(message.content_encoding or "utf-8")


def _accept(app: Any) -> set[str]:
    return set(prepare_accept_content(app.conf.accept_content or ["json"]))


def read_call(app: Any, message: Any, decode_error: BaseException | None) -> Call | Refusal:
    """The task call a dead message holds, or why no worker could ever run it.

    Read as Celery's consumer reads it: the body decoded only if its content type is
    accepted (pickle is never unpickled), a ``task`` header (or a protocol 1 body) naming a
    task this app has, the headers and body Celery reads unguarded
    (:func:`.envelope.task_problem`), the arguments within ``JOBS_MAX_PAYLOAD_BYTES``.
    """
    if decode_error is not None:  # kombu could not even decompress it
        return Refusal(history.qualified_name(type(decode_error)), str(decode_error))
    headers = dict(message.headers) if isinstance(message.headers, Mapping) else {}
    body = body_bytes(message)
    try:
        decoded = kombu_loads(
            body, message.content_type, message.content_encoding, accept=_accept(app)
        )
    except Exception as exc:
        return Refusal(history.qualified_name(type(exc)), str(exc)[:500])
    if "task" not in headers and isinstance(decoded, dict) and "task" in decoded:
        # Protocol 1: the call is the body.
        headers.update(task=decoded["task"], id=decoded.get("id"))
        decoded = [decoded.get("args") or [], decoded.get("kwargs") or {}, {}]
    if "task" not in headers:
        return Refusal(UNKNOWN_MESSAGE, "message has no task header (not a Celery task message)")
    problem = envelope.task_problem(headers, decoded)
    if problem is not None:
        return Refusal(envelope.UNREADABLE_MESSAGE, problem)
    if headers["task"] not in app.tasks:
        return Refusal(NOT_REGISTERED, f"unknown task {headers['task']!r}")
    if not isinstance(decoded, list) or len(decoded) != 3:
        return Refusal(envelope.UNREADABLE_MESSAGE, "body is not [args, kwargs, options]")
    limit = int(app.jobs_settings.max_payload_bytes)
    size = envelope.oversize(body, decoded, max_bytes=limit, dumps=kombu_dumps)
    if size is not None:
        return Refusal(
            envelope.PAYLOAD_TOO_LARGE,
            f"arguments of {size} bytes are over JOBS_MAX_PAYLOAD_BYTES ({limit} bytes)",
        )
    args, kwargs, options = decoded
    return Call(headers, list(args), dict(kwargs), dict(options or {}))


def content_chain(message: Any) -> str:
    """A key for a message with no task id: its content and its death record, which a
    redelivery from the dead queue leaves as they were."""
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    kept = {str(k): v for k, v in headers.items() if k not in _PER_DELIVERY}
    digest = hashlib.sha256()
    digest.update(body_bytes(message))
    digest.update(b"\x1f")
    digest.update(json.dumps(kept, sort_keys=True, default=str).encode())
    digest.update(f"\x1f{message.content_type}\x1f{message.content_encoding}".encode())
    return f"amqp:{digest.hexdigest()}"


def _stored_headers(headers: Mapping[str, Any]) -> dict[str, Any]:
    return {
        str(k): v
        for k, v in headers.items()
        if k not in BROKER_HEADERS and k != history.ERRORS_HEADER
    }


def _final_entry(error_type: str, error: str, attempt: int, death: Death) -> dict[str, Any]:
    entry = history.entry(error_type, error, attempt)
    entry["death"] = death.entry()
    return entry


def _delivery_limit(app: Any, queue: str) -> int | None:
    declared = app.amqp.queues.get(queue)
    value = (getattr(declared, "queue_arguments", None) or {}).get("x-delivery-limit")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _why(app: Any, death: Death, retries: int) -> tuple[str, int]:
    """What to say of the death, and how many attempts the job had."""
    queue = death.queue
    if death.reason == "delivery_limit":
        limit = _delivery_limit(app, queue)
        if limit is None:
            lost = "its worker was lost each time"
            return f"delivered more often than queue {queue!r} allows: {lost}", retries + 1
        return (
            f"delivered {limit + 1} times from queue {queue!r} (x-delivery-limit {limit}), never "
            "acknowledged: its worker was lost each time",
            retries + limit + 1,
        )
    if death.reason == "expired":
        ttl = f" ({death.original_expiration} ms)" if death.original_expiration else ""
        return f"expired in queue {queue!r} at the end of its TTL{ttl}, before it ran", retries
    if death.reason == "rejected":
        return f"rejected without requeue by a consumer of queue {queue!r}", retries + 1
    if death.reason == "maxlen":
        return f"dropped by queue {queue!r} at its length limit, before it ran", retries
    return f"dead-lettered by the broker from queue {queue!r} ({death.reason!r})", retries


def task_letter(app: Any, message: Any, call: Call, death: Death) -> DeadLetter:
    """The dead letter of a task message the broker dead-lettered."""
    headers = call.headers
    retries = headers.get("retries")
    retries = retries if isinstance(retries, int) and not isinstance(retries, bool) else 0
    error, attempts = _why(app, death, retries)
    error_type = ERROR_TYPES.get(death.reason, UNKNOWN_DEATH)
    stored = _stored_headers(headers)
    links = canvas_links({**headers, **call.options}, headers.get("id"))
    if links:
        stored[history.CANVAS_HEADER] = links
    enqueued = headers.get(history.ENQUEUED_HEADER)
    properties = message.properties if isinstance(message.properties, Mapping) else {}
    return DeadLetter(
        reason=REASONS.get(death.reason, "rejected"),
        task_id=str(headers["id"]),
        task_name=str(headers["task"]),
        queue=death.queue,
        errors=[
            *history.errors_of(headers),
            _final_entry(error_type, error, max(attempts, 1), death),
        ],
        failed_at=death.time or utcnow(),
        args=arguments.to_stored(call.args),
        kwargs=arguments.to_stored(call.kwargs),
        headers=arguments.to_stored(stored),
        priority=properties.get("priority"),
        exchange=death.exchange,
        routing_key=death.routing_key,
        attempts=attempts,
        enqueued_at=parse_time(enqueued),
        replay_of=row_id_or_none(headers.get(history.REPLAY_OF_HEADER)),
        # As every other path keys this job (letters._letter): one row whoever reports it.
        chain=str(enqueued or ""),
    )


def poison_dead_letter(message: Any, refusal: Refusal, death: Death) -> DeadLetter:
    """The ``poison`` dead letter of a message no worker could run, byte for byte."""
    letter = poison_letter(message, refusal.error_type, refusal.error, None)
    letter = rawpoison.exact(letter, body_bytes(message))
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    enqueued = headers.get(history.ENQUEUED_HEADER)
    chain = str(enqueued or "") if letter.task_id else content_chain(message)
    return dataclasses.replace(
        letter,
        queue=death.queue,
        exchange=death.exchange,
        routing_key=death.routing_key,
        headers=arguments.to_stored(_stored_headers(headers)),
        errors=[_final_entry(refusal.error_type, refusal.error, 1, death)],
        failed_at=death.time or utcnow(),
        chain=chain,
    )


def upstream_of(app: Any, letter: DeadLetter, call: Call) -> DeadLetter | None:
    """The step a chain or link would have run after the dead job: ``upstream_failed``."""
    step = next_step_of({**call.headers, **call.options})
    if step is None:
        return None
    links: dict[str, Any] = {"upstream": letter.task_id}
    canvas = (letter.headers or {}).get(history.CANVAS_HEADER)
    if isinstance(canvas, dict):
        links.update(canvas)
        remainder = links.get("chain_remainder")
        if isinstance(remainder, list):
            links["chain_remainder"] = remainder[1:]  # the first is the step itself
            if not links["chain_remainder"]:
                del links["chain_remainder"]
        links.pop("callbacks", None)
    return upstream_letter(
        app,
        step,
        error_type=letter.error_type,
        error=f"not run: the job before it in its chain ({letter.task_name}[{letter.task_id}]) "
        f"died: {letter.error_message}",
        links=links,
        worker=None,
    )


def letters_of(
    app: Any, message: Any, decode_error: BaseException | None = None
) -> list[DeadLetter]:
    """The dead letters one dead message makes: its own, then the step it would have run."""
    headers = message.headers if isinstance(message.headers, Mapping) else {}
    delivery = message.delivery_info if isinstance(message.delivery_info, Mapping) else {}
    death = death_of(headers, fallback_queue=_text(delivery.get("routing_key")))
    call = read_call(app, message, decode_error)
    if isinstance(call, Refusal):
        return [poison_dead_letter(message, call, death)]
    letter = task_letter(app, message, call, death)
    upstream = upstream_of(app, letter, call)
    return [letter] if upstream is None else [letter, upstream]


def letters_or_poison(
    app: Any, message: Any, decode_error: BaseException | None = None
) -> list[DeadLetter]:
    """:func:`letters_of`, or if building them fails (a bug), the raw message as poison:
    the message must not be acknowledged without a row, nor block the queue."""
    try:
        return letters_of(app, message, decode_error)
    except Exception as exc:
        logger.exception(
            "jobs.dlq.drain_unreadable: a dead message could not be read; kept as poison",
            extra={"event": "jobs.dlq.drain_unreadable"},
        )
        refusal = Refusal(history.qualified_name(type(exc)), f"unreadable dead message: {exc}")
        headers = message.headers if isinstance(message.headers, Mapping) else {}
        return [poison_dead_letter(message, refusal, death_of(headers))]


# -- keeping a letter -------------------------------------------------------------------------


def keep(app: Any, letter: DeadLetter) -> bool:
    """Whether ``letter`` is durably kept: in the table (new or already there), spooled
    for the drainer (the database is down), or set aside as one the database refuses for
    good. ``False`` only when neither the database nor the spool took it."""
    from jobs_platform.deadletter.drainer import wake
    from jobs_platform.deadletter.sink import is_transient, rejected_why, sink_for
    from jobs_platform.process_local import fork_safe

    sink = sink_for(app)
    letter = letter.redact(sink.redact_keys)
    if not sink.breaker.is_open():  # the database failed moments ago: straight to the spool
        try:
            with fork_safe():  # no fork of this process while SQLite/psycopg are in use
                sink.write(letter)
        except Exception as exc:
            if not is_transient(exc):
                sink.report_rejected(letter, exc)
                return _spooled(sink, letter, aside=rejected_why(letter, exc))
            logger.warning(
                "jobs.dlq.drain_db_failed: dead letter for %s[%s] goes to the spool: %s",
                letter.task_name,
                letter.task_id,
                exc,
                extra={"event": "jobs.dlq.drain_db_failed"},
            )
        else:
            return True
    if _spooled(sink, letter):
        wake()
        return True
    return False


def _spooled(sink: Any, letter: DeadLetter, *, aside: str | None = None) -> bool:
    text = letter.to_json()
    try:
        if aside is None:
            sink.spool.push(text)
        else:
            sink.spool.reject(text, aside)
    except Exception as exc:
        logger.error(
            "jobs.dlq.spool_failed: dead letter for %s[%s] stays in the broker's dead queue "
            "%r until the database or the spool answers: %s",
            letter.task_name,
            letter.task_id,
            DEAD_QUEUE,
            exc,
            extra={"event": "jobs.dlq.spool_failed"},
        )
        return False
    return True


# -- the bootstep -----------------------------------------------------------------------------


class DeadLetterDrain(bootsteps.StartStopStep):  # type: ignore[misc]
    """A thread in the worker's main process consuming :data:`DEAD_QUEUE` on a connection
    of its own (module doc)."""

    label = "RabbitMQ dead-letter drain"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        #: Set while the drain consumes; ``sessions`` counts the times it started to (tests
        #: wait for them).
        self.consuming = threading.Event()
        self.sessions = 0
        self._thread: threading.Thread | None = None
        self._connection: Connection | None = None

    def start(self, parent: Any) -> None:
        # Declared now, before the worker consumes and may reject bad input: a message
        # dead-lettered to an exchange that does not exist yet is dropped by the broker.
        declare_now(parent.app)
        self.run_in_thread(parent.app)

    def run_in_thread(self, app: Any) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(app,), name="jobs-rabbitmq-dlx-drain", daemon=True
        )
        self._thread.start()

    def stop(self, parent: Any = None) -> None:
        """Stop consuming; unacknowledged dead messages go back to the queue as they are."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=15)

    def terminate(self, parent: Any = None) -> None:
        self.stop(parent)

    # -- the thread ---------------------------------------------------------------------------

    def _run(self, app: Any) -> None:
        backoff = BACKOFF_MIN_S
        while not self._stop.is_set():
            try:
                # Heartbeats find a half-open connection (checked between waits).
                heartbeat = float(app.conf.broker_heartbeat or 0)
                with app.connection_for_read(heartbeat=heartbeat) as conn:
                    conn.ensure_connection(max_retries=1)
                    self._connection = conn
                    backoff = BACKOFF_MIN_S
                    self._consume(app, conn)
            except Exception as exc:
                self.consuming.clear()
                logger.warning(
                    "jobs.dlq.drain_reconnect: the dead-letter drain lost the broker (%s: %s); "
                    "reconnecting in %.1f s",
                    type(exc).__name__,
                    exc,
                    backoff,
                    extra={"event": "jobs.dlq.drain_reconnect"},
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)
            finally:
                self.consuming.clear()
                self._connection = None

    def _consume(self, app: Any, conn: Connection) -> None:
        channel = conn.channel()
        declare(channel)

        def on_message(message: Any) -> None:
            self._handle(app, message, None)

        def on_decode_error(message: Any, exc: BaseException) -> None:
            self._handle(app, message, exc)

        consumer = Consumer(
            channel,
            queues=[dead_queue()],
            on_message=on_message,
            on_decode_error=on_decode_error,
            prefetch_count=PREFETCH,
            auto_declare=False,
        )
        with consumer:
            self.sessions += 1
            self.consuming.set()
            logger.info(
                "jobs.dlq.drain_started: draining RabbitMQ queue %r into the dead-letter table",
                DEAD_QUEUE,
                extra={"event": "jobs.dlq.drain_started"},
            )
            while not self._stop.is_set():
                with contextlib.suppress(TimeoutError):  # no dead message within POLL_S
                    conn.drain_events(timeout=POLL_S)
                conn.heartbeat_check()

    def _handle(self, app: Any, message: Any, decode_error: BaseException | None) -> None:
        """Keep the message's letters, then acknowledge it; retry while they cannot be kept
        (the message waits unacknowledged: nothing is lost, nothing hot-loops)."""
        letters = letters_or_poison(app, message, decode_error)
        wait = BACKOFF_MIN_S
        while not self._stop.is_set():
            if all(keep(app, letter) for letter in letters):
                message.ack()
                return
            self._stop.wait(wait)
            wait = min(wait * 2, BACKOFF_MAX_S)
            if self._connection is not None:
                self._connection.heartbeat_check()
        # Stopping: left unacknowledged, the broker gives it to the next drain.


def install(app: Any) -> None:
    """Add the drain to ``app``'s workers (idempotent: the blueprint holds a set)."""
    app.steps["worker"].add(STEP)
