"""The topology as kombu entities, declared and checked against what the vhost holds.

:func:`task_queues` is Celery's ``task_queues`` (quorum queues, declared with their
arguments: Celery detects quorum queues only from these, and then uses per-consumer
prefetch and its native delayed delivery). :func:`declare_topology` declares the dead-letter
exchange and queue first, then every work queue, each on a channel of its own: RabbitMQ
answers a queue or exchange that exists with another type or other arguments with
``PRECONDITION_FAILED - inequivalent arg ...`` and closes the channel, so every mismatch is
collected, then reported in one :class:`~jobs_platform.errors.ConfigError` naming the queue,
what differs and how to migrate (:func:`.topology.migration_advice`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from typing import Any

from amqp.exceptions import PreconditionFailed
from kombu import Connection, Exchange, Queue
from kombu.transport.native_delayed_delivery import (
    bind_queue_to_native_delayed_delivery_exchange,
    declare_native_delayed_delivery_exchanges_and_queues,
)

from jobs_platform.brokers.rabbitmq import topology
from jobs_platform.errors import ConfigError

_INEQUIVALENT = re.compile(
    r"inequivalent arg '(?P<arg>[^']+)' for (?P<kind>queue|exchange) '(?P<name>[^']+)' in "
    r"vhost '(?P<vhost>[^']*)': received (?P<received>.+?) but current is (?P<current>.+)$"
)


def kombu_queue(decl: topology.QueueDecl) -> Queue:
    return Queue(
        decl.name,
        Exchange(decl.exchange, type=decl.exchange_type, durable=True),
        routing_key=decl.routing_key,
        queue_arguments=dict(decl.arguments),
        durable=True,
    )


def task_queues(names: Iterable[str], *, delivery_limit: int) -> list[Queue]:
    """Celery's ``task_queues``: every work queue, quorum, on its topic exchange."""
    return [kombu_queue(d) for d in topology.work_queues(names, delivery_limit=delivery_limit)]


def dead_letter_queue() -> Queue:
    return kombu_queue(topology.dead_queue())


def vhost_of(connection: Connection) -> str:
    return str(connection.virtual_host or "/")


def describe(error: PreconditionFailed, vhost: str) -> str:
    """One mismatch in words: what differs and how to migrate."""
    text = str(getattr(error, "reply_text", "") or error)
    found = _INEQUIVALENT.search(text)
    if found is None:
        return f"RabbitMQ refused the declaration: {text}"
    arg, kind, name = found["arg"], found["kind"], found["name"]
    if kind == "exchange":
        return (
            f"exchange {name!r} exists with another {arg} (the platform declares "
            f"{found['received']}, the vhost has {found['current']}); exchanges cannot change "
            f"in place: use a new vhost, or delete the exchange (`rabbitmqctl "
            f"delete_exchange -p {vhost} {name}`) once nothing publishes to it"
        )
    what = "type" if arg == "x-queue-type" else f"argument {arg}"
    current = found["current"]
    if arg == "x-queue-type" and current.strip() in ("none", "'classic'"):
        current = "a classic queue"
    return (
        f"queue {name!r} exists with another {what} (the platform declares "
        f"{found['received']}, the vhost has {current}); " + topology.migration_advice(name, vhost)
    )


def declare_topology(connection: Connection, queues: Iterable[Queue]) -> None:
    """Declare the dead-letter exchange and queue, then ``queues``; ConfigError listing
    every queue or exchange that exists with another type or arguments."""
    vhost = vhost_of(connection)
    problems: list[str] = []
    for entity in (dead_letter_queue(), *queues):
        channel = connection.channel()
        try:
            entity.bind(channel).declare()
        except PreconditionFailed as exc:
            said = describe(exc, vhost)
            if isinstance(entity, Queue) and not is_quorum(connection, entity):
                said = (
                    f"queue {entity.name!r} is a classic queue; the platform declares quorum "
                    "queues (replicated, with a delivery limit and at-least-once "
                    f"dead-lettering); {topology.migration_advice(entity.name, vhost)}"
                )
            problems.append(said)
        finally:
            _close_quietly(channel)
    if problems:
        raise ConfigError(
            f"the RabbitMQ vhost {vhost!r} does not hold what jobs-platform declares "
            "(quorum queues on topic exchanges, dead-lettering into "
            f"{topology.DEAD_EXCHANGE!r}); nothing was consumed:\n- " + "\n- ".join(problems)
        )


def is_quorum(connection: Connection, queue: Queue) -> bool:
    """Whether the existing ``queue`` is a quorum queue: RabbitMQ names only the first
    argument that differs, so a declaration naming the type alone tells (refused: the type
    differs; accepted: it is the same, and nothing changes)."""
    channel = connection.channel()
    try:
        channel.queue_declare(
            queue=queue.name,
            durable=queue.durable,
            exclusive=queue.exclusive,
            auto_delete=queue.auto_delete,
            arguments={"x-queue-type": "quorum"},
        )
    except PreconditionFailed as exc:
        return "x-queue-type" not in str(getattr(exc, "reply_text", "") or exc)
    finally:
        _close_quietly(channel)
    return True


def set_up_delayed_delivery(connection: Connection, queues: Iterable[Queue]) -> None:
    """Celery's native delayed delivery: the 28 level queues, and **every** declared queue
    bound to the delivery exchange (not only the queues this worker consumes: a delayed job
    for another queue would otherwise be dropped when due, celery#9959/#9960)."""
    declare_native_delayed_delivery_exchanges_and_queues(connection, "quorum")
    for queue in queues:
        bind_queue_to_native_delayed_delivery_exchange(connection, queue)


def _close_quietly(channel: Any) -> None:
    with contextlib.suppress(Exception):  # a channel the broker closed (precondition failed)
        channel.close()
