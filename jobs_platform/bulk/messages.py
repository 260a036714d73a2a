"""Task messages for a bulk dispatch: Celery builds the first of each kind, the rest copy it.

The first call of each *kind* (the same options, apart from ``countdown``/``eta``/``task_id``)
goes through Celery's own ``Task.apply_async`` with a :class:`Recorder` as its producer:
Celery routes it, builds the protocol-2 headers, properties and task-sent event, fires the
publish signals, and the recorder keeps what was built while passing it on to the
pipeline. Every other call of that kind is that message with the fields that differ from
call to call replaced (:data:`PER_CALL_HEADERS`; a unit test builds messages through
Celery and checks that nothing else differs), which is what makes bulk dispatch cheap.

A kind is copied only when Celery's path holds no surprises: no receivers of the publish
signals (they may change each message), no compression, no pydantic arguments, no custom
``shadow_name`` and only the options in :data:`COPYABLE_OPTIONS`. Otherwise every call of
the kind goes through Celery's path, still into the same pipeline.

Task-sent events (``task_send_sent_event``) go out in lists under the ``task.multi``
routing key, as a worker sends its own task events; Celery's event receivers (Flower,
exporters) read both forms.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import celery
import kombu
from celery import signals
from celery.utils.saferepr import saferepr
from celery.utils.time import add_seconds_to_datetime, maybe_make_aware
from kombu import serialization
from kombu.utils.json import dumps as kombu_dumps

from jobs_platform import dispatch, history, signature_check
from jobs_platform.bulk.calls import Call

#: Header fields that differ between two messages of one kind (besides the enqueue stamp).
PER_CALL_HEADERS = ("id", "root_id", "argsrepr", "kwargsrepr", "eta")
#: Options under which a kind's messages are copies of its first one.
COPYABLE_OPTIONS = frozenset(
    {
        "countdown",
        "eta",
        "task_id",
        "queue",
        "priority",
        "headers",
        "time_limit",
        "soft_time_limit",
        "ignore_result",
    }
)
#: Task-sent events per ``task.multi`` message.
EVENTS_PER_MESSAGE = 100
_PUBLISH_KEYS = ("mandatory", "immediate", "timeout", "confirm_timeout")


@dataclasses.dataclass(slots=True)
class Wire:
    """A task message as kombu's Producer hands it to the channel."""

    priority: Any
    content_type: str
    content_encoding: str
    headers: dict[str, Any]
    properties: dict[str, Any]
    exchange: Any
    routing_key: Any
    publish: dict[str, Any]


@dataclasses.dataclass(slots=True)
class Prototype:
    """What every message of one kind shares (from the first one, built by Celery)."""

    wire: Wire
    embed: Any  # the third element of the body: callbacks, errbacks, chain, chord
    serializer: str
    root_is_id: bool  # no parent task: each message is its own root
    stamp_given: bool  # the caller set the enqueue stamp header
    event: dict[str, Any] | None
    ignored: bool
    #: How a call's ``[args, kwargs]`` JSON ends to make its body JSON (``, <embed>]``),
    #: or None when that does not give exactly what the serializer writes.
    body_tail: str | None = None


class Recorder(kombu.Producer):  # type: ignore[misc]
    """A Producer that passes what it publishes to a :class:`~.publish.Sink`, in order,
    keeps the last task message's parts, and holds task-sent events for :meth:`send_events`."""

    def __init__(self, channel: Any, sink: Any, *, events_exchange: str) -> None:
        self.sink = sink
        self.events_exchange = events_exchange
        self.events: list[dict[str, Any]] = []
        self.event_options: dict[str, Any] = {}
        self.last: Wire | None = None
        self.last_body: Any = None
        self.last_options: dict[str, Any] = {}
        self._declared: set[tuple[str, Any]] = set()
        super().__init__(channel, auto_declare=False)

    def publish(self, body: Any, routing_key: Any = None, **options: Any) -> Any:
        if (
            options.get("exchange") == self.events_exchange
            and isinstance(body, dict)
            and body.get("type") == "task-sent"
        ):
            self.events.append(body)
            self.event_options = options
            return None
        self.last_body, self.last_options = body, options
        return super().publish(body, routing_key=routing_key, **options)

    def maybe_declare(self, entity: Any, retry: bool = False, **policy: Any) -> Any:
        # Once per dispatch: kombu's own check copies the entity on every publish.
        key = (type(entity).__name__, getattr(entity, "name", entity))
        if key in self._declared:
            return False
        declared = super().maybe_declare(entity, retry, **policy)
        self._declared.add(key)
        return declared

    def _publish(
        self,
        body: Any,
        priority: Any,
        content_type: str,
        content_encoding: str,
        headers: dict[str, Any],
        properties: dict[str, Any],
        routing_key: Any,
        mandatory: Any,
        immediate: Any,
        exchange: Any,
        declare: Any,
        timeout: Any = None,
        confirm_timeout: Any = None,
        retry: bool = False,
        retry_policy: Any = None,
    ) -> None:
        for entity in declare or ():
            self.maybe_declare(entity)
        publish = dict(
            zip(_PUBLISH_KEYS, (mandatory, immediate, timeout, confirm_timeout), strict=True)
        )
        wire = Wire(
            priority, content_type, content_encoding, headers, dict(properties), exchange,
            routing_key, publish,
        )  # fmt: skip
        self.last = wire
        self.send(wire, body, content_type, content_encoding, headers, properties)

    def send(
        self,
        wire: Wire,
        body: Any,
        content_type: str,
        content_encoding: str,
        headers: dict[str, Any],
        properties: dict[str, Any],
    ) -> None:
        message = self.channel.prepare_message(
            body, wire.priority, content_type, content_encoding, headers, properties
        )
        self.sink.publish(
            message, exchange=wire.exchange, routing_key=wire.routing_key, **wire.publish
        )

    def send_events(self) -> None:
        """The held task-sent events, in lists of :data:`EVENTS_PER_MESSAGE`."""
        events, self.events = self.events, []
        options = {**self.event_options, "retry": False}
        for start in range(0, len(events), EVENTS_PER_MESSAGE):
            super().publish(events[start : start + EVENTS_PER_MESSAGE], "task.multi", **options)


class Messages:
    """Publishes each call through a :class:`Recorder`: by Celery, or as a copy."""

    def __init__(self, task: Any, recorder: Recorder) -> None:
        self.task = task
        self.app = task.app
        self.recorder = recorder
        self.kinds: dict[Any, Prototype | None] = {}
        self._keys: dict[int, Any] = {}
        amqp = self.app.amqp
        self.maxsize = (amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize)
        self.maxlevels = self.app.conf.task_repr_maxlevels
        self.parent = self.app.current_worker_task
        self.copyable = copyable_task(task)

    def publish(self, call: Call, stamp: str) -> Any:
        """Send ``call`` (enqueue stamp ``stamp``); its AsyncResult."""
        key = self._key(call.options)
        prototype = self.kinds.get(key)
        if prototype is not None:
            return self._copy(prototype, call, stamp)
        result = self._through_celery(call, stamp)
        if key not in self.kinds:
            self.kinds[key] = self._learn(call, result) if self.copyable else None
        return result

    def _key(self, options: dict[str, Any]) -> Any:
        key = self._keys.get(id(options))
        if key is None:
            key = tuple(sorted((k, repr(v)) for k, v in options.items() if k not in _PER_CALL))
            self._keys[id(options)] = key
        return key

    def _through_celery(self, call: Call, stamp: str) -> Any:
        options = dispatch.stamped({k: v for k, v in call.options.items() if k != "task_id"}, stamp)
        self.recorder.last = None
        # Checked when read (jobs_platform.bulk.calls, the outbox).
        with signature_check.unchecked():
            return celery.Task.apply_async(
                self.task,
                call.args,
                call.kwargs,
                task_id=call.task_id,
                producer=self.recorder,
                **options,
            )

    def _learn(self, call: Call, result: Any) -> Prototype | None:
        """The kind's prototype from the message Celery just built, if it can be copied."""
        recorder, wire = self.recorder, self.recorder.last
        if wire is None or wire.headers.get("id") != call.task_id:
            return None
        if set(call.options) - COPYABLE_OPTIONS or recorder.last_options.get("compression"):
            return None
        event = None
        if recorder.events and recorder.events[-1].get("uuid") == call.task_id:
            event = recorder.events[-1]
        elif self.app.conf.task_send_sent_event:
            return None
        prototype = Prototype(
            wire=wire,
            embed=recorder.last_body[2],
            serializer=recorder.last_options.get("serializer") or recorder.serializer,
            root_is_id=wire.headers.get("root_id") == call.task_id,
            stamp_given=history.ENQUEUED_HEADER in (call.options.get("headers") or {}),
            event=event,
            ignored=bool(getattr(result, "ignored", False)),
        )
        prototype.body_tail = _body_tail(prototype, call)
        return prototype

    def _copy(self, proto: Prototype, call: Call, stamp: str) -> Any:
        task_id, args, kwargs = call.task_id, call.args, call.kwargs
        argsrepr = fast_repr(args, self.maxsize[0], self.maxlevels)
        kwargsrepr = fast_repr(kwargs, self.maxsize[1], self.maxlevels)
        eta = self._eta(call.options)
        wire = proto.wire
        headers = wire.headers.copy()
        headers["id"] = task_id
        headers["argsrepr"] = argsrepr
        headers["kwargsrepr"] = kwargsrepr
        headers["eta"] = eta
        if proto.root_is_id:
            headers["root_id"] = task_id
        if not proto.stamp_given:
            headers[history.ENQUEUED_HEADER] = stamp
        if proto.body_tail is not None and call.payload:
            # The checks already wrote the JSON of [args, kwargs]: the body is that plus the
            # embed, byte for byte what the serializer writes (checked per kind).
            body: Any = call.payload[:-1] + proto.body_tail
            content_type, content_encoding = wire.content_type, wire.content_encoding
        else:
            content_type, content_encoding, body = serialization.dumps(
                (args, kwargs, proto.embed), serializer=proto.serializer
            )
        properties = wire.properties.copy()
        properties["correlation_id"] = task_id
        self.recorder.send(wire, body, content_type, content_encoding, headers, properties)
        if proto.event is not None:
            event = proto.event.copy()
            event["uuid"] = task_id
            event["args"] = argsrepr
            event["kwargs"] = kwargsrepr
            event["eta"] = eta
            event["clock"] = self.app.clock.forward()
            event["timestamp"] = time.time()
            if proto.root_is_id:
                event["root_id"] = task_id
            self.recorder.events.append(event)
        result = self.task.AsyncResult(task_id)
        result.ignored = proto.ignored
        if self.parent is not None:
            self.parent.add_trail(result)  # as send_task does inside a running task
        return result

    def _eta(self, options: Mapping[str, Any]) -> str | None:
        """The ``eta`` header, computed as Celery's ``as_task_v2`` does."""
        countdown = options.get("countdown")
        if countdown:
            now = self.app.now()
            moment = maybe_make_aware(add_seconds_to_datetime(now, countdown), tz=self.app.timezone)
            return str(moment.isoformat())
        eta = options.get("eta")
        if not eta:
            return None
        return eta if isinstance(eta, str) else str(eta.isoformat())


_PER_CALL = frozenset({"countdown", "eta", "task_id"})


def _body_tail(proto: Prototype, call: Call) -> str | None:
    """``", <embed JSON>]"`` if appending it to a call's ``[args, kwargs]`` JSON (minus its
    ``]``) gives the serializer's body for ``call``; else None (then each body is dumped)."""
    if proto.serializer != "json" or not call.payload:
        return None
    _type, _encoding, body = serialization.dumps(
        (call.args, call.kwargs, proto.embed), serializer="json"
    )
    tail = str(kombu_dumps([proto.embed]))[1:]  # '{...}]'
    candidate = call.payload[:-1] + ", " + tail
    return ", " + tail if candidate == body else None


def copyable_task(task: Any) -> bool:
    """Whether Celery's path for ``task`` builds messages that copies can reproduce."""
    hooked = any(
        getattr(signal, "receivers", None)
        for signal in (signals.before_task_publish, signals.after_task_publish, signals.task_sent)
    )
    return (
        not hooked
        and getattr(task, "_dump_pydantic_arguments", None) is None
        and getattr(type(task), "shadow_name", None) is getattr(celery.Task, "shadow_name", None)
        and not task.app.conf.task_compression
    )


def _plain(value: Any) -> bool:
    if type(value) is str:
        return value.isascii() and value.isprintable() and "'" not in value and "\\" not in value
    return type(value) in (int, float, bool, type(None))


def fast_repr(value: Any, maxsize: int, maxlevels: int) -> str:
    """``saferepr(value, maxsize, maxlevels=...)``, without its cost for flat containers of
    plain values (numbers, None, printable ASCII strings), whose saferepr is their repr."""
    kind = type(value)
    if kind is tuple or kind is list:
        plain = all(_plain(v) for v in value)
    elif kind is dict:
        plain = all(type(k) is str and _plain(k) and _plain(v) for k, v in value.items())
    else:
        plain = False
    if plain:
        text = repr(value)
        if len(text) <= maxsize // 2:  # far from saferepr's truncation
            return text
    return str(saferepr(value, maxsize, maxlevels=maxlevels))
