"""Every private Celery, kombu, billiard and Flower name the platform relies on, in one list.

The platform plugs into Celery through its public seams where it can (settings, signals,
bootsteps, ``worker_consumer``, ``control_cls``, ``broker_transport``, Task subclasses). A
few behaviours have no public seam; each is listed here with what the platform does with
the name, why, and the public hook it would use if Celery or kombu had one.
``tests/unit/test_internals.py`` checks every entry still has the expected shape at the
pinned versions, so an upgrade that moves one fails there, by name, and not in a chaos run.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Literal

Use = Literal["overridden", "called", "read", "written", "replaced", "copied"]


@dataclasses.dataclass(frozen=True)
class Internal:
    #: ``module:Class`` or ``module`` that owns the name.
    owner: str
    #: The name (``_brpop_start``), or a dotted path below ``owner``.
    name: str
    use: Use
    #: The platform module that relies on it.
    where: str
    why: str
    #: The public hook that would make this unnecessary.
    missing_hook: str
    #: For a callable: its parameter names as the platform calls or overrides it.
    params: tuple[str, ...] | None = None
    #: For an attribute set in ``__init__`` (not on the class): checked in its source.
    instance_attribute: bool = False

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.name}"


_REDIS = "kombu.transport.redis:Channel"
_FETCH = "jobs_platform.brokers.redis.fetch"
_NO_FETCH_HOOK = "a kombu Redis channel hook to replace the BRPOP poll (a fetch strategy)"

INTERNALS: tuple[Internal, ...] = (
    # -- the cheap retry ----------------------------------------------------------------------
    Internal(
        "celery.app.trace",
        "ExceptionInfo",
        "replaced",
        "jobs_platform.cheap_retry",
        "the tracer builds billiard's ExceptionInfo of every Retry (frames and all): half a "
        "retry's CPU; the platform builds a frameless one for the retries it published",
        "a tracer hook that decides how a Retry's exception info is built",
    ),
    Internal(
        "billiard.einfo:ExceptionInfo",
        "__init__",
        "copied",
        "jobs_platform.cheap_retry",
        "the frameless info is made with __new__ and billiard's attributes (type, tb, "
        "traceback, internal, exception), so Celery reads it like any other",
        "a public constructor taking the text of a traceback",
        params=("self", "exc_info", "internal"),
    ),
    # -- a chord callback that will not run ---------------------------------------------------
    Internal(
        "celery.backends.base:Backend",
        "chord_error_from_stack",
        "replaced",
        "jobs_platform.deadletter.hooks",
        "every result backend gives up a chord's callback through it (a header member died, "
        "or the callback could not be sent); wrapped, the callback becomes an upstream_failed "
        "dead letter before Celery stores its FAILURE",
        "a signal sent when a chord's callback is failed without running",
        params=("self", "callback", "exc"),
    ),
    # -- the kill-safe fetch ------------------------------------------------------------------
    Internal(
        _REDIS,
        "_brpop_start",
        "overridden",
        _FETCH,
        "sends the fetch script (or BLMOVE) instead of BRPOP on the consuming connection",
        _NO_FETCH_HOOK,
        params=("self", "timeout"),
    ),
    Internal(
        _REDIS,
        "_brpop_read",
        "overridden",
        _FETCH,
        "reads the script's reply and delivers it the way kombu delivers a BRPOP reply",
        _NO_FETCH_HOOK,
        params=("self", "options"),
    ),
    Internal(
        _REDIS,
        "_poll_error",
        "overridden",
        _FETCH,
        "a failed read of the script's reply is parsed for the command that was sent",
        _NO_FETCH_HOOK,
        params=("self", "type", "options"),
    ),
    Internal(
        _REDIS,
        "_in_poll",
        "written",
        _FETCH,
        "kombu's marker of a command in flight on the consuming connection",
        _NO_FETCH_HOOK,
    ),
    Internal(
        _REDIS,
        "_brpop_sent_at",
        "written",
        _FETCH,
        "kombu's health check reads when the poll was sent",
        _NO_FETCH_HOOK,
    ),
    Internal(
        _REDIS,
        "_queue_cycle",
        "read",
        _FETCH,
        "which queues to fetch from, in kombu's round-robin order, and rotating it after",
        _NO_FETCH_HOOK,
        instance_attribute=True,
    ),
    Internal(
        _REDIS,
        "_flush_brpop_reauth",
        "called",
        _FETCH,
        "a re-authentication is flushed when the consuming connection goes idle, as kombu does",
        _NO_FETCH_HOOK,
        params=("self",),
    ),
    Internal(
        _REDIS,
        "_q_for_pri",
        "called",
        "jobs_platform.brokers.redis.fetch, .transport",
        "the name of a queue's priority sub-list",
        "a public name for a queue's priority lists",
        params=("self", "queue", "pri"),
    ),
    Internal(
        "kombu.transport.virtual:Transport",
        "_deliver",
        "called",
        _FETCH,
        "hands a fetched message to the consumer's callback, as a BRPOP reply is",
        _NO_FETCH_HOOK,
        params=("self", "message", "queue"),
    ),
    # -- the transport, the poison screen, the QoS ---------------------------------------------
    Internal(
        _REDIS,
        "_put",
        "overridden",
        "jobs_platform.brokers.redis.transport",
        "every task message passes here: a long delay goes to the delayed store instead",
        "a publish hook on the channel (kombu's before_publish sees no channel)",
        params=("self", "queue", "message", "kwargs"),
    ),
    Internal(
        _REDIS,
        "_create_client",
        "overridden",
        "jobs_platform.brokers.redis.transport",
        "one redis client per connection pool instead of one per publish or ack",
        "a client-reuse option",
        params=("self", "asynchronous"),
    ),
    Internal(
        _REDIS,
        "_get_message_priority",
        "called",
        "jobs_platform.brokers.redis.transport",
        "the priority sub-list a stored message is released onto",
        "a public priority of a message dict",
        params=("self", "message", "reverse"),
    ),
    Internal(
        _REDIS,
        "_get_client",
        "overridden",
        "jobs_platform.brokers.redis.poison",
        "the channel's redis client class: its replies are screened for poison",
        "a hook on what a BRPOP/RPOP reply may contain before kombu parses it",
        params=("self",),
    ),
    Internal(
        _REDIS,
        "_fanout_queues",
        "read",
        "jobs_platform.brokers.redis.poison",
        "broadcast queues are not screened",
        "a public list of a channel's fanout queues",
    ),
    Internal(
        _REDIS,
        "_connparams",
        "called",
        "jobs_platform.brokers.redis.reconnect",
        "the connection parameters, read while live, to ack on a detached channel",
        "a channel that can still ack after its connection was collected",
        params=("self", "asynchronous"),
    ),
    Internal(
        "celery.worker.consumer.delayed_delivery",
        "DelayedDelivery",
        "replaced",
        "jobs_platform.brokers.rabbitmq.consumer",
        "left out of the RabbitMQ worker's consumer blueprint by this path: at every "
        "reconnect it set delayed delivery up on each URL of a failover list, retrying a "
        "dead node for ~9 s, and the consumer consumed nothing meanwhile (17.6 s with one "
        "node of three down); the platform sets it up once at worker start",
        "a setting to set delayed delivery up once, or on the connected node only",
    ),
    Internal(
        "kombu.transport.redis:SentinelChannel",
        "_connparams",
        "called",
        "jobs_platform.brokers.redis.transport",
        "on Sentinel, the master's connection parameters read while live, so an ack on a "
        "detached channel asks the Sentinels for the master as kombu's own pool does",
        "a channel that can still ack after its connection was collected",
        params=("self", "asynchronous"),
    ),
    Internal(
        "kombu.transport.virtual:QoS",
        "_delivered",
        "read",
        "jobs_platform.brokers.redis.reconnect",
        "how many messages a worker held when its connection died (kept, not restored)",
        "a public count of held deliveries",
    ),
    # -- worker leases ---------------------------------------------------------------------------
    Internal(
        "kombu.transport.redis:QoS",
        "restore_visible",
        "overridden",
        "jobs_platform.brokers.redis.liveness",
        "kombu's restore cycle (every restore interval, in the consuming loop) carries the "
        "worker's lease renewal and the claim of lost workers' jobs",
        "a periodic hook of the consuming channel",
        params=("self", "start", "num", "interval"),
    ),
    Internal(
        "kombu.transport.redis:QoS",
        "_remove_from_indices",
        "overridden",
        "jobs_platform.brokers.redis.liveness",
        "an acked, rejected or restored job leaves its owner's held set in the same pipeline",
        "an ack hook on the QoS",
        params=("self", "delivery_tag", "pipe"),
    ),
    Internal(
        _REDIS,
        "_do_restore_message",
        "called",
        "jobs_platform.brokers.redis.liveness",
        "a lost worker's job goes back to its queue exactly as kombu's restore_by_tag puts it",
        "restore_by_tag with a hook to mark the message",
        params=("self", "payload", "exchange", "routing_key", "pipe", "leftmost"),
    ),
    # -- dead letters ---------------------------------------------------------------------------
    Internal(
        "celery.worker.request:Request",
        "_announce_revoked",
        "overridden",
        "jobs_platform.deadletter.hooks",
        "an expiry is reported from the worker's main process: the letter needs the request",
        "the request in task_revoked's arguments",
        params=("self", "reason", "terminated", "signum", "expired"),
    ),
    Internal(
        "celery.worker.request:Request",
        "_announce_cancelled",
        "overridden",
        "jobs_platform.deadletter.hooks",
        "a cancel on connection loss whose RETRY write fails must leave the message "
        "unacknowledged, not acknowledge it",
        "a cancel that cannot fail on the result backend",
        params=("self", "emit_retry"),
    ),
    Internal(
        "celery.worker.request:Request",
        "_already_cancelled",
        "written",
        "jobs_platform.deadletter.hooks",
        "marked before anything can fail, so the child's death is not taken for a revoke",
        "the same",
    ),
    Internal(
        "celery.app.task:Context",
        "_get_custom_headers",
        "called",
        "jobs_platform.deadletter.replay",
        "a dead job's own headers, without Celery's protocol headers, for a replay",
        "a public view of a request's custom headers",
        params=("self", "args", "kwargs"),
    ),
    # -- beat, bulk dispatch, task events, Flower ----------------------------------------------
    Internal(
        "celery.beat",
        "_evaluate_entry_args",
        "called",
        "jobs_platform.schedule.scheduler",
        "an entry's arguments as Celery's own scheduler evaluates them before sending",
        "a public method on ScheduleEntry",
        params=("entry_args",),
    ),
    Internal(
        "celery.beat",
        "_evaluate_entry_kwargs",
        "called",
        "jobs_platform.schedule.scheduler",
        "the same for keyword arguments",
        "a public method on ScheduleEntry",
        params=("entry_kwargs",),
    ),
    Internal(
        "kombu.messaging:Producer",
        "_publish",
        "overridden",
        "jobs_platform.bulk.messages",
        "a bulk records what Celery built for its first message of each kind, then copies it",
        "a hook that returns the message Celery would publish without publishing it",
        params=(
            "self",
            "body",
            "priority",
            "content_type",
            "content_encoding",
            "headers",
            "properties",
            "routing_key",
            "mandatory",
            "immediate",
            "exchange",
            "declare",
            "timeout",
            "confirm_timeout",
            "retry",
            "retry_policy",
        ),
    ),
    Internal(
        "celery.app.amqp:AMQP",
        "as_task_v2",
        "copied",
        "jobs_platform.bulk.messages",
        "a copied message's eta header is computed as as_task_v2 computes it",
        "the same hook",
    ),
    Internal(
        "celery.worker.control",
        "Panel.data.enable_events",
        "replaced",
        "jobs_platform.events.lease",
        "enable_events renews a lease instead of switching task events on for good",
        "a per-app control command registry",
    ),
    Internal(
        "celery.worker.consumer.events:Events",
        "send_events",
        "written",
        "jobs_platform.events.lease",
        "the event dispatcher is made live on a worker started without heartbeats",
        "a setting to create the dispatcher enabled",
        instance_attribute=True,
    ),
    Internal(
        "celery.bin.celery",
        "find_app",
        "replaced",
        "jobs_platform.cli.errors",
        "the -A app is loaded here, inside the celery group's callback, which turns any error "
        "into a usage error with its whole traceback: a ConfigError becomes one short message",
        "an error handler for app loading in Celery's CLI",
        params=("app", "symbol_by_name", "imp"),
    ),
    Internal(
        "flower.options",
        "default_options",
        "written",
        "jobs_platform.flower",
        "Flower's starting options from the settings table, before it parses its own",
        "an app-level place for Flower's defaults",
    ),
)


def resolve(entry: Internal) -> Any:
    """The object ``entry`` names (raises AttributeError/ImportError when it is gone)."""
    module_name, _, class_name = entry.owner.partition(":")
    target: Any = importlib.import_module(module_name)
    if class_name:
        target = getattr(target, class_name)
    if entry.instance_attribute:
        source = inspect.getsource(target.__init__)
        if f"self.{entry.name} =" not in source:
            raise AttributeError(f"{entry.owner}.__init__ no longer sets self.{entry.name}")
        return None
    for part in entry.name.split("."):
        target = target[part] if isinstance(target, dict) else getattr(target, part)
    return target


def problem(entry: Internal) -> str | None:
    """What is wrong with ``entry`` at the installed versions, or None."""
    try:
        target = resolve(entry)
    except (AttributeError, ImportError, KeyError, OSError, TypeError) as exc:
        return f"{entry.label} is gone: {exc}"
    if entry.params is not None:
        params = tuple(inspect.signature(target).parameters)
        if params != entry.params:
            return f"{entry.label} takes {params}, the platform expects {entry.params}"
    return None


def problems() -> list[str]:
    """Every entry that no longer holds (empty at the pinned versions)."""
    return [found for found in map(problem, INTERNALS) if found is not None]
