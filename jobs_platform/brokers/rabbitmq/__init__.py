"""The RabbitMQ broker (``amqp://``, ``amqps://``): quorum queues, confirmed publishes.

::

    topology.py  names, types and arguments of what the platform declares     (pure)
    delays.py    a countdown/ETA as whole seconds of native delayed delivery   (pure)
    declare.py   the topology as kombu entities, declared and checked          (kombu)
    startup.py   the worker's start-up: topology checked, delays bound         (Celery)
    dispatch.py  every publish: delays rounded up, priorities refused          (Celery)
    revoke.py    revoke reaching a job waiting in the delayed-delivery queues  (Celery, Redis)
    received.py  a delayed message's arrival: its queue's key, revoked or not  (Celery)
    reading.py   queue depths (passive declare), ping, bulk's publish session  (kombu)

What differs from the Redis broker, and why:

- **Coordination needs its own Redis** (``JOBS_COORDINATION_URL``, refused when empty):
  locks, rate limits, beat, metric sums, the dead-letter spool and revoked ids live there;
  so does the result backend unless ``JOBS_RESULT_BACKEND`` says otherwise.
- **One vhost per app and environment**: queue and exchange names are not prefixed.
- **Delays** are RabbitMQ's (Celery's native delayed delivery), not a store: no
  ``delayed_store``; a wait is rounded up to whole seconds (:mod:`.delays`).
- **The delivery timeout** is the server's ``consumer_timeout`` (30 min by default): a job
  held unacknowledged longer is handed to another worker while it still runs, so every
  hard time limit must end before it (``JOBS_RABBITMQ_CONSUMER_TIMEOUT`` says what the
  server is set to; raise it in ``rabbitmq.conf``: ``consumer_timeout = 7200000`` (ms)).
- **Redelivery cap**: ``x-delivery-limit`` (``JOBS_DELIVERY_LIMIT``) on every queue; a
  message handed out that many times is dead-lettered into ``jobs.dead``.
- **No priorities**: quorum queues on 3.10 refuse ``x-max-priority`` (4.x has two levels);
  priority 0, the one level, is accepted, any other is refused at finalize and dispatch.
- **No fair queues**, no in-flight reading and no oldest age (see the attributes).
"""

from __future__ import annotations

import socket
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from celery import signals

from jobs_platform.brokers.interface import (
    DeliveryTimeout,
    FairKey,
    InflightState,
    PublishSession,
    QueueState,
    Sweep,
)
from jobs_platform.brokers.rabbitmq import declare, reading, topology
from jobs_platform.errors import ConfigError
from jobs_platform.urls import masked

SCHEMES = ("amqp", "amqps")
#: The worker bootstep that declares and checks the topology (by name: producers skip it).
TOPOLOGY_STEP = "jobs_platform.brokers.rabbitmq.startup:TopologyCheck"
#: ``control_cls``: revoke reaches delayed jobs (:mod:`.revoke`).
CONTROL = "jobs_platform.brokers.rabbitmq.revoke:Control"
#: py-amqp's errors that mean the server went away (socket errors are caught by name
#: in dispatch already: ConnectionError, TimeoutError).
_DOWN = frozenset(
    {"amqp.exceptions.RecoverableConnectionError", "kombu.exceptions.OperationalError"}
)


class RabbitMQBroker:
    name = "RabbitMQ"
    #: Quorum queues on RabbitMQ 3.10 serve one level (``x-max-priority`` is refused;
    #: 4.0-4.2 have two, 4.3 has 32): 0, the default, is that level; any other is refused.
    highest_priority = 0
    #: Why ``fairness_key`` is refused at declaration on this broker.
    no_fair_queues: str | None = (
        "RabbitMQ hands out a queue's messages in order; taking them round robin across keys "
        "needs per-key queues the platform does not declare (use the Redis broker, or give "
        "the noisy tenant a queue class of its own)"
    )

    # -- configuration and start-up -------------------------------------------------------

    def check_url(self, url: str, *, setting: str) -> None:
        """``amqp[s]://[user:password@]host[:port][/vhost]``, or Celery's ``;``-separated
        failover list of them (a cluster's nodes), each checked."""
        for one in url.split(";"):
            check_one_url(one.strip(), setting=setting, whole=url)

    def celery_config(self, settings: Any) -> dict[str, Any]:
        timeout = settings.dispatch_timeout
        return {
            # Quorum queues drop a message whose channel closes before the confirm
            # (celery#9149): every publish waits for the broker's confirm.
            "broker_transport_options": {"confirm_publish": True},
            # Every queue quorum, on a topic exchange (declared with its arguments: Celery
            # detects quorum queues from them, for per-consumer prefetch and delays).
            "task_queues": declare.task_queues(
                queue_names(settings), delivery_limit=settings.delivery_limit
            ),
            "task_default_exchange_type": topology.EXCHANGE_TYPE,
            "broker_native_delayed_delivery_queue_type": "quorum",
            # The result backend is the coordination Redis unless set (settings.py).
            "result_backend_transport_options": {
                "retry_policy": {
                    "max_retries": 100,
                    "interval_start": 0,
                    "interval_step": 0.2,
                    "interval_max": 0.5,
                    "timeout": timeout / 2,
                }
            },
            "redis_socket_connect_timeout": timeout / 4,
        }

    def delivery_timeout(self, settings: Any) -> DeliveryTimeout:
        # RabbitMQ closes the channel of a consumer holding a delivery past consumer_timeout
        # and redelivers it, running or not: every hard time limit must end before it.
        return DeliveryTimeout(
            "consumer timeout",
            "JOBS_RABBITMQ_CONSUMER_TIMEOUT",
            float(settings.rabbitmq_consumer_timeout),
            bounds_running_jobs=True,
        )

    def install(self, app: Any) -> None:
        """Every worker declares and checks the topology and binds every queue to delayed
        delivery at start; each publish rounds its delay up; revoke reaches delayed jobs."""
        from jobs_platform.brokers.rabbitmq import consumer, deadletters, dispatch, received

        app.steps["worker"].add(TOPOLOGY_STEP)
        app.control_cls = CONTROL
        dispatch.install(app)
        signals.task_received.connect(
            received.on_received, weak=False, dispatch_uid="jobs.rabbitmq.received"
        )
        # What the broker dead-letters (delivery limit, expiry, rejection) drains into the
        # SQL table (no task_failure fires on that path); bad input is rejected there too
        # instead of Celery's silent ack. After the dead-letter install: it overrides
        # worker_consumer, and the drain needs the drainer step.
        deadletters.install(app)
        # The poison screen's consumer, without Celery's per-reconnect delayed-delivery step.
        app.conf.worker_consumer = consumer.CONSUMER

    def check_live(self, app: Any) -> None:
        options = app.conf.broker_transport_options or {}
        if not options.get("confirm_publish"):
            raise ConfigError(
                "broker_transport_options['confirm_publish'] is off: quorum queues drop a "
                "message whose channel closes before the confirm; set it only through "
                "jobs-platform"
            )
        for queue in app.conf.task_queues or ():
            if (queue.queue_arguments or {}).get("x-queue-type") != "quorum":
                raise ConfigError(
                    f"task_queues: {queue.name!r} is not declared as a quorum queue; on "
                    "RabbitMQ jobs-platform declares its queues itself"
                )
        from jobs_platform.brokers.rabbitmq.dispatch import check_task_priorities

        check_task_priorities(app)

    # -- reading the queues -----------------------------------------------------------------

    def queue_states(self, app: Any, queues: Sequence[str]) -> Mapping[str, QueueState]:
        """Ready messages per queue (passive ``queue_declare``). The oldest message's age is
        ``None``: AMQP cannot peek at a queue without taking the message, and the
        management API (which could tell) is not assumed."""
        return {q: QueueState(n, None) for q, n in reading.ready_counts(app, queues).items()}

    def inflight(self, app: Any) -> InflightState | None:
        """``None``: over AMQP a queue says only how many messages are ready; how many are
        delivered and unacknowledged (and since when) needs the management API."""
        return None

    def fair_keys(self, app: Any, queues: Sequence[str]) -> list[FairKey]:
        return []

    def ping(self, url: str, timeout_s: float) -> tuple[bool, str]:
        return reading.ping(url, timeout_s)

    # -- dispatch -----------------------------------------------------------------------------

    def is_down(self, exc: BaseException) -> bool:
        if isinstance(exc, socket.timeout | ConnectionError):
            return True
        return any(f"{cls.__module__}.{cls.__qualname__}" in _DOWN for cls in type(exc).__mro__)

    def reach(self, app: Any, channel: Any) -> None:
        """A pooled AMQP channel is open or its connection raises on first use; kombu's
        ``ensure_connection`` (bulk's ``_connect``) has already reached the broker."""

    def publish_session(self, channel: Any) -> PublishSession:
        return reading.OneByOneSession(channel)

    # -- delays and worker upkeep ----------------------------------------------------------

    def delayed_store(self, app: Any) -> None:
        """``None``: delays wait in RabbitMQ's ``celery_delayed_N`` queues."""
        return None

    def restore_sweep(self, worker: Any) -> Sweep | None:
        """``None``: RabbitMQ requeues a lost consumer's deliveries itself."""
        return None


def queue_names(settings: Any) -> list[str]:
    from jobs_platform.routing import QUEUE_NAMES

    return topology.queue_names(QUEUE_NAMES, settings.default_queue, settings.routes)


def check_one_url(url: str, *, setting: str, whole: str) -> None:
    shown = masked(whole)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{setting}={shown!r} is not a valid URL: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(
            f"{setting}={shown!r}: every URL of a failover list must be amqp:// or amqps://, "
            f"not {parts.scheme}://"
        )
    if not parts.hostname:
        raise ConfigError(
            f"{setting}={shown!r} has no host; expected {parts.scheme}://HOST[:PORT][/VHOST]"
        )
    if port == 0:
        raise ConfigError(f"{setting}={shown!r}: port 0 is not a port")
    vhost = urllib.parse.unquote(parts.path[1:]) if parts.path.startswith("/") else parts.path
    if "/" in vhost.strip("/") and vhost != "/":
        raise ConfigError(
            f"{setting}={shown!r}: the path is one vhost name (one vhost per app and "
            f"environment: queue names are not prefixed), got {parts.path!r}; a vhost with "
            "a slash in its name is spelt with %2F"
        )


BROKER = RabbitMQBroker()
