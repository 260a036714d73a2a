"""What the platform declares on a RabbitMQ vhost: names, types and arguments (pure: data).

Every work queue is a **quorum** queue (each message replicated on a Raft majority) bound to
a **topic** exchange of its own name with its name as routing key: a direct exchange gets no
native delayed delivery from Celery (the worker would hold a delayed message unacknowledged
until its ETA). Every work queue dead-letters, at least once, into :data:`DEAD_EXCHANGE`
(fanout) and :data:`DEAD_QUEUE`, which the dead-letter drain consumes.

Names are not prefixed (nor are Celery's ``celery_delayed_*``): **one vhost per app and
environment**. A queue's type and arguments cannot change in place (RabbitMQ answers
``inequivalent arg``): moving to other arguments means a new vhost, or draining and deleting
the queue first (:func:`migration_advice`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

#: The exchange every work queue dead-letters into (fanout: one queue takes everything).
DEAD_EXCHANGE = "jobs.dead"
DEAD_EXCHANGE_TYPE = "fanout"
#: The queue the dead-letter drain consumes: quorum, durable, no dead-letter arguments of
#: its own (a message rejected there would have nowhere to go but away).
DEAD_QUEUE = "jobs.dead"
#: Work queues' exchanges (native delayed delivery needs topic or fanout, not direct).
EXCHANGE_TYPE = "topic"
#: What ``x-dead-letter-strategy: at-least-once`` needs: publishes refused (not old
#: messages dropped) when a queue is full, so no message leaves without reaching the DLX.
OVERFLOW = "reject-publish"
#: Celery's native delayed delivery: its delivery exchange and its 28 level queues.
DELAYED_DELIVERY_EXCHANGE = "celery_delayed_delivery"
DELAYED_LEVELS = 28


def delayed_level_queues() -> tuple[str, ...]:
    """``celery_delayed_0`` .. ``celery_delayed_27`` (what every worker declares)."""
    return tuple(f"celery_delayed_{level}" for level in range(DELAYED_LEVELS))


def work_queue_arguments(delivery_limit: int) -> dict[str, Any]:
    """The arguments of every work queue (the contract with the dead-letter drain)."""
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": DEAD_EXCHANGE,
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": OVERFLOW,
        "x-delivery-limit": delivery_limit,
    }


def dead_queue_arguments() -> dict[str, Any]:
    return {"x-queue-type": "quorum"}


@dataclasses.dataclass(frozen=True)
class QueueDecl:
    """One queue as the platform declares it."""

    name: str
    exchange: str
    exchange_type: str
    routing_key: str
    arguments: dict[str, Any]


def work_queues(names: Iterable[str], *, delivery_limit: int) -> list[QueueDecl]:
    """The declared work queues, each on its own topic exchange, in ``names`` order."""
    seen: dict[str, QueueDecl] = {}
    for name in names:
        if name not in seen:
            seen[name] = QueueDecl(
                name, name, EXCHANGE_TYPE, name, work_queue_arguments(delivery_limit)
            )
    return list(seen.values())


def dead_queue() -> QueueDecl:
    return QueueDecl(DEAD_QUEUE, DEAD_EXCHANGE, DEAD_EXCHANGE_TYPE, "", dead_queue_arguments())


def queue_names(
    queue_classes: Iterable[str], default_queue: str, routes: Mapping[str, str]
) -> list[str]:
    """Every queue the app can route to: the queue classes, the default queue, each route's."""
    return list(dict.fromkeys([*queue_classes, default_queue, *routes.values()]))


def migration_advice(queue: str, vhost: str) -> str:
    """How to move a queue whose type or arguments differ (they cannot change in place)."""
    return (
        f"a queue's type and arguments cannot change in place: either point JOBS_BROKER_URL "
        f"at a new vhost (one vhost per app and environment), or stop the producers, let the "
        f"workers drain {queue!r}, then delete it (`rabbitmqctl delete_queue -p {vhost} "
        f"{queue}`) and start a worker, which declares it again"
    )
