"""The worker's consumer on RabbitMQ: the poison screen, and no delayed-delivery set-up on
every reconnect.

Celery's consumer runs its ``DelayedDelivery`` step at every consumer (re)start, and it
sets delayed delivery up on *each* URL of a ``;``-separated failover list, retrying a node
that is down three times (sleeping 1, 3 and 5 s) before the consumer consumes anything.
With one node of a cluster dead, every reconnect then stalled the worker ~18 s (measured on
a three-node cluster: no job finished for 17.6 s after the leader's node was killed, the
worker itself reconnected to a live node in 0.03 s; 0.7 s without the step). The platform
declares delayed delivery and binds every queue once, at worker start
(:class:`.startup.TopologyCheck`, which refuses to start if that fails); the exchanges,
queues and bindings are durable and replicated across the cluster, so a reconnect has
nothing to set up.

On a green pool (gevent) the task events go out on a connection without publisher confirms
and without heartbeats. Celery's green event loop (``celery.worker.loops.synloop``) drains
the event dispatcher's connection after *every* message it reads, with a 0.1 s timeout,
whenever that connection supports heartbeats: the worker took at most ~10 messages a second
whatever its concurrency (measured: "received" lines 0.10 s apart, 100 prefetched messages
waiting), and with ``confirm_publish`` that drain is a second reader of the socket on which
an event publish, holding the dispatcher's lock, waits for its confirm: a confirm read by
the drain leaves the publisher (and every greenlet sending an event after it: the consumer's
``task-received``, each job's ``task-succeeded`` inside the pool's hard time limit) waiting,
the stall seen on the demo (messages delivered, unacknowledged, never logged as received; a
job "Hard time limit exceeded" 60 s after it succeeded). Events are monitoring, sent on a
transient classic queue: no confirm is needed, and a broken connection fails the next
publish, which reconnects.
"""

from __future__ import annotations

from typing import Any

from jobs_platform.brokers.rabbitmq.poison import PoisonConsumer

#: ``worker_consumer`` on the RabbitMQ broker (a string: only workers import it).
CONSUMER = "jobs_platform.brokers.rabbitmq.consumer:Consumer"
#: Celery's per-(re)start delayed-delivery step (jobs_platform.internals lists the name).
CELERY_DELAYED_DELIVERY_STEP = "celery.worker.consumer.delayed_delivery:DelayedDelivery"


class Consumer(PoisonConsumer):
    class Blueprint(PoisonConsumer.Blueprint):  # type: ignore[misc,name-defined]
        default_steps = [
            step
            for step in PoisonConsumer.Blueprint.default_steps
            if step != CELERY_DELAYED_DELIVERY_STEP
        ]

    def connection_for_write(self, url: Any = None, heartbeat: Any = None) -> Any:
        """The event dispatcher's connection (Celery's ``Events`` step is the one caller)."""
        if not getattr(self.pool, "is_green", False):
            return super().connection_for_write(url=url, heartbeat=heartbeat)
        options = dict(self.app.conf.broker_transport_options or {})
        options["confirm_publish"] = False
        conn = self.app.connection_for_write(url=url, heartbeat=0, transport_options=options)
        conn.__class__ = events_connection_class(type(conn))
        return self.ensure_connected(conn)


def events_connection_class(cls: type) -> type:
    """``cls`` saying it has no heartbeats: the green loop then neither drains it after every
    message nor checks heartbeats on it (it negotiated none: ``heartbeat=0``)."""
    made = _EVENTS_CLASSES.get(cls)
    if made is None:
        made = _EVENTS_CLASSES[cls] = type(
            f"Events{cls.__name__}", (cls,), {"supports_heartbeats": False}
        )
    return made


_EVENTS_CLASSES: dict[type, type] = {}
