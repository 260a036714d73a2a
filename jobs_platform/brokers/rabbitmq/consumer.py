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
"""

from __future__ import annotations

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
