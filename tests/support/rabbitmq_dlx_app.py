"""A Celery app on RabbitMQ wired as the platform wires it for dead letters and bad input.

``create_app`` does not take ``amqp://`` yet on this branch, so this is a plain Celery app
configured by hand per the RabbitMQ broker's contract: one quorum queue ``fast`` on a topic
exchange that dead-letters to ``jobs.dead`` (at-least-once, reject-publish, a delivery limit
of :data:`DELIVERY_LIMIT`), ``confirm_publish``, late acknowledgement with redelivery when the
worker is lost, JSON only; then the platform's dead-letter table (its receivers and drainer:
``jobs_platform.deadletter.install``), the RabbitMQ poison consumer and the RabbitMQ drain.

Environment: ``JOBS_TEST_AMQP_URL`` (the test's own vhost), ``JOBS_BROKER_URL`` (a Redis: the
settings' coordination, where the dead-letter spool lives, and where tasks record their
runs: tests.support.recording), ``JOBS_DATABASE_URL`` (the dead-letter table).
"""

from __future__ import annotations

import os
import signal
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from jobs_platform import deadletter
from jobs_platform.brokers.rabbitmq import deadletters, poison
from jobs_platform.settings import Settings
from tests.support.recording import client, record

#: x-delivery-limit of the queue: a job is delivered at most DELIVERY_LIMIT + 1 times.
DELIVERY_LIMIT = 2
QUEUE = "fast"
EXCHANGE = "jobs"


def make_app(amqp_url: str, **settings: Any) -> Any:
    """The app on the vhost at ``amqp_url`` (``settings``: overrides of the settings table)."""
    app = Celery("rabbitmq_dlx_app", set_as_current=False)
    app.jobs_settings = Settings.load(**{"dlq_drain_interval": 0.5, **settings})
    app.conf.update(
        broker_url=amqp_url,
        broker_transport_options={"confirm_publish": True},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        task_queues=[
            Queue(
                QUEUE,
                Exchange(EXCHANGE, type="topic"),
                routing_key=QUEUE,
                queue_arguments=deadletters.dead_lettering_arguments(DELIVERY_LIMIT),
            )
        ],
        task_default_queue=QUEUE,
        task_default_exchange=EXCHANGE,
        task_default_exchange_type="topic",
        task_default_routing_key=QUEUE,
        task_create_missing_queues=False,
        enable_utc=True,
    )
    deadletter.install(app)
    poison.install(app)
    deadletters.install(app)

    @app.task(name="dlx.kill_worker", bind=True, shared=False)
    def kill_worker(self: Any, key: str, *payload: Any, **options: Any) -> None:
        """SIGKILL the whole worker (main process and pool) while running: the broker sees
        the connection drop and delivers the message again."""
        record(self, key)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    @app.task(name="dlx.ok", bind=True, shared=False)
    def ok(self: Any, key: str) -> str:
        record(self, key)
        client().rpush(f"jptest:done:{key}", str(self.request.id))
        return key

    return app


#: The worker's app (``celery -A tests.support.rabbitmq_dlx_app worker``).
app = make_app(os.environ.get("JOBS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/unset"))
