"""The worker's start-up on RabbitMQ: the topology declared and checked, delays set up.

:class:`TopologyCheck` is a worker bootstep that runs when the worker is built, before its
consumer declares or consumes anything. It

1. declares the dead-letter exchange and queue and every work queue (all of them, not only
   the ones this worker consumes), refusing to start with a ConfigError that names each
   queue whose type or arguments differ on the vhost and how to migrate (never a silent
   mix of classic and quorum queues, never a bare stack trace of a closed channel);
2. sets up Celery's native delayed delivery and binds **every** declared queue to it.
   Celery's own step binds only at start and goes on with a log line when it fails
   ("Native delayed delivery will not be available"): a job delayed then would sit in
   ``celery_delayed_N`` for a queue nobody bound. Here a failure is an error log and a
   worker that does not start.

The broker may be starting too (a deploy, a cluster's node): the connection is retried for
``JOBS_RABBITMQ_STARTUP_WAIT`` seconds before the worker gives up.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from jobs_platform.brokers.rabbitmq import declare
from jobs_platform.errors import ConfigError
from jobs_platform.urls import masked

logger = logging.getLogger("jobs_platform.brokers.rabbitmq")


class TopologyCheck(bootsteps.Step):  # type: ignore[misc]
    label = "jobs-platform RabbitMQ topology"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        check_and_declare(worker.app)


def check_and_declare(app: Any) -> None:
    """Declare and check the topology, then set up delayed delivery (module doc)."""
    queues = list(app.amqp.queues.values())
    wait_s = float(app.jobs_settings.rabbitmq_startup_wait)
    with app.connection_for_write() as connection:
        try:
            connection.ensure_connection(max_retries=None, timeout=wait_s, interval_max=2)
        except Exception as exc:
            raise ConfigError(
                f"RabbitMQ at {masked(str(app.conf.broker_url))} did not answer within "
                f"{wait_s:g} s (JOBS_RABBITMQ_STARTUP_WAIT); the worker cannot check its "
                f"queues: {exc}"
            ) from exc
        declare.declare_topology(connection, queues)
        try:
            declare.set_up_delayed_delivery(connection, queues)
        except Exception as exc:
            logger.error(
                "jobs.rabbitmq.delayed_delivery_failed: native delayed delivery could not be "
                "set up on %s: %s: retries, countdowns and ETAs would not arrive; the worker "
                "does not start",
                masked(str(app.conf.broker_url)),
                exc,
                extra={"event": "jobs.rabbitmq.delayed_delivery_failed"},
            )
            raise ConfigError(
                f"native delayed delivery could not be set up on RabbitMQ (celery_delayed_0..27 "
                f"and the bindings of {', '.join(q.name for q in queues)}): {exc}; check the "
                "user's configure/write permissions on the vhost"
            ) from exc
    logger.info(
        "jobs.rabbitmq.topology: %d quorum queue(s) checked and bound to delayed delivery",
        len(queues),
        extra={"event": "jobs.rabbitmq.topology"},
    )
