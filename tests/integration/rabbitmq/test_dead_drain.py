"""The RabbitMQ dead-letter drain against the real broker, in a vhost of each test's own.

The drain (jobs_platform.brokers.rabbitmq.deadletters.DeadLetterDrain) runs in this
process, on a connection of its own, as a worker runs it; the broker does the
dead-lettering itself (a TTL that runs out, deliveries past x-delivery-limit, a reject
without requeue), so no worker is needed to make a dead message. Rows go to a SQLite table
(PostgreSQL in tests/acceptance/test_rabbitmq_deadletters.py); the spool is on the test
session's Redis database, under a key of each test's own.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import kombu
import pytest
import redis

from jobs_platform import db
from jobs_platform.brokers.rabbitmq import deadletters
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.testing import wait_for
from jobs_platform.testing.rabbitmq import list_queues, rabbitmq_vhost, rabbitmqctl
from tests.support.rabbitmq_dlx_app import DELIVERY_LIMIT, QUEUE, make_app


@pytest.fixture()
def vhost_url() -> Iterator[str]:
    with rabbitmq_vhost() as url:
        yield url


@pytest.fixture()
def db_url(sqlite_url: str) -> str:
    db.upgrade(sqlite_url)
    return sqlite_url


@pytest.fixture()
def spool_key() -> str:
    return f"jptest:dlq:{uuid.uuid4().hex[:8]}"


@pytest.fixture()
def app(vhost_url: str, redis_url: str, db_url: str, spool_key: str) -> Any:
    app = make_app(
        vhost_url,
        broker_url=redis_url,
        database_url=db_url,
        dlq_spool_key=spool_key,
        dlq_write_attempts=1,
    )
    declare(app)
    return app


def declare(app: Any) -> None:
    """The work queue and the dead-letter exchange and queue, as the broker's topology
    declares them before anything is published."""
    assert deadletters.declare_now(app)
    with app.connection_for_write() as conn:
        app.amqp.queues[QUEUE](conn.default_channel).declare()


class Drains:
    """Drains started by a test, stopped at its end."""

    def __init__(self) -> None:
        self.running: list[deadletters.DeadLetterDrain] = []

    def start(self, app: Any) -> deadletters.DeadLetterDrain:
        drain = deadletters.DeadLetterDrain(None)
        drain.run_in_thread(app)
        self.running.append(drain)
        wait_for(drain.consuming.is_set, timeout_s=20, message="the drain to consume")
        return drain

    def stop(self) -> None:
        for drain in self.running:
            drain.stop()
        self.running.clear()


@pytest.fixture()
def drains() -> Iterator[Drains]:
    started = Drains()
    try:
        yield started
    finally:
        started.stop()


def vhost_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


def depth(url: str, queue: str) -> int:
    """Messages in ``queue``, ready or held unacknowledged by a consumer."""
    found = {r["name"]: r for r in list_queues(vhost_of(url), "name", "messages")}
    return int(found[queue]["messages"]) if queue in found else 0


def ready(url: str, queue: str) -> int:
    """Messages ready in ``queue`` (over AMQP: cheaper to poll than rabbitmqctl)."""
    with kombu.Connection(url) as conn:
        return int(conn.default_channel.queue_declare(queue, passive=True).message_count)


def rows(db_url: str, **where: Any) -> list[dict[str, Any]]:
    return DeadLetterStore(db_url).listing(Filter(**where), page_size=100)


def wait_rows(db_url: str, count: int, **where: Any) -> list[dict[str, Any]]:
    return wait_for(
        lambda: found if len(found := rows(db_url, **where)) >= count else None,
        timeout_s=20,
        message=lambda: f"{count} dead-letter row(s) {where} (have {rows(db_url)})",
    )


def wait_drained(url: str) -> None:
    """The dead queue holds nothing, not even unacknowledged: every message was acked."""
    wait_for(
        lambda: ready(url, deadletters.DEAD_QUEUE) == 0 and depth(url, deadletters.DEAD_QUEUE) == 0,
        timeout_s=20,
        message=f"{deadletters.DEAD_QUEUE} to be empty",
    )


def deliver_and_drop(url: str, times: int) -> None:
    """Take the head of the work queue ``times`` times and close the channel holding it, as
    a worker killed mid-job does (the broker counts each as a failed delivery)."""
    with kombu.Connection(url) as conn:
        for _ in range(times):
            channel = conn.channel()
            message = wait_for(
                lambda channel=channel: channel.basic_get(QUEUE, no_ack=False),
                timeout_s=10,
                message="a message in the work queue",
            )
            assert message is not None
            channel.close()


# -- the broker's dead-lettering, each reason -----------------------------------------------


def test_an_expired_job_is_one_expired_row_with_its_arguments(
    app: Any, db_url: str, vhost_url: str, drains: Drains
) -> None:
    drains.start(app)
    # A per-message TTL (AMQP ``expiration``): no worker takes it, the broker expires it.
    result = app.send_task("dlx.ok", args=["expiring"], kwargs={}, expiration=0.2)
    (row,) = wait_rows(db_url, 1)
    assert row["reason"] == "expired"
    assert (row["task_id"], row["task_name"], row["queue"]) == (result.id, "dlx.ok", QUEUE)
    assert row["args"] == ["expiring"] and row["kwargs"] == {}
    assert row["error_type"] == "jobs_platform.MessageExpired"
    death = row["errors"][-1]["death"]
    assert death["reason"] == "expired" and death["original_expiration_ms"] == "200"
    assert "x-death" not in row["headers"] and row["headers"]["task"] == "dlx.ok"
    wait_drained(vhost_url)


def test_a_job_delivered_past_the_limit_is_one_worker_lost_row(
    app: Any, db_url: str, vhost_url: str, drains: Drains
) -> None:
    drains.start(app)
    result = app.send_task("dlx.ok", args=["lost"], kwargs={"n": 1})
    # Delivered DELIVERY_LIMIT + 1 times, each time lost: the broker dead-letters it.
    deliver_and_drop(vhost_url, DELIVERY_LIMIT + 1)
    (row,) = wait_rows(db_url, 1)
    assert (row["reason"], row["task_id"]) == ("worker_lost", result.id)
    assert row["args"] == ["lost"] and row["kwargs"] == {"n": 1}
    assert row["attempts"] == DELIVERY_LIMIT + 1
    assert row["error_type"] == "jobs_platform.DeliveryLimitExceeded"
    assert row["errors"][-1]["death"]["queue"] == QUEUE
    assert depth(vhost_url, QUEUE) == 0
    wait_drained(vhost_url)


def test_a_job_rejected_without_requeue_is_one_rejected_row(
    app: Any, db_url: str, vhost_url: str, drains: Drains
) -> None:
    drains.start(app)
    result = app.send_task("dlx.ok", args=["rejected"])
    with kombu.Connection(vhost_url) as conn:
        channel = conn.channel()
        message = wait_for(lambda: channel.basic_get(QUEUE, no_ack=False), timeout_s=10)
        channel.basic_reject(message.delivery_info["delivery_tag"], requeue=False)
    (row,) = wait_rows(db_url, 1)
    assert (row["reason"], row["task_id"], row["args"]) == ("rejected", result.id, ["rejected"])


# -- at-least-once: the same dead message twice is one row ---------------------------------


def copy_dead_messages(url: str, copies: int) -> int:
    """Publish ``copies`` copies of every message in the dead queue back into it, with the
    same body, properties and headers (x-death included): what a redelivery hands the
    drain. The originals stay. Returns how many messages were copied.

    Published with confirms: a quorum queue drops what a channel published when the channel
    closes before the confirm (celery#9149), and this one closes right after (seen: the
    copies missing in one clean-clone run)."""
    with kombu.Connection(url, transport_options={"confirm_publish": True}) as conn:
        channel = conn.channel()
        held = []
        while (message := channel.basic_get(deadletters.DEAD_QUEUE, no_ack=False)) is not None:
            held.append(message)
        producer = kombu.Producer(channel, exchange=deadletters.dead_exchange())
        for message in held:
            for _ in range(copies):
                producer.publish(
                    message.body,
                    headers=dict(message.headers),
                    content_type=message.content_type,
                    content_encoding=message.content_encoding,
                    routing_key=message.delivery_info["routing_key"],
                )
        channel.close()  # the originals go back, unacknowledged
        return len(held)


def test_a_dead_message_delivered_several_times_is_still_one_row(
    app: Any, db_url: str, vhost_url: str, drains: Drains
) -> None:
    # Two dead messages wait for a drain: bytes with no task id that a consumer rejected
    # (poison, keyed by their content and death record), and a job that expired.
    with kombu.Connection(vhost_url, transport_options={"confirm_publish": True}) as conn:
        kombu.Producer(conn.default_channel).publish(
            b"\x00not json", exchange="jobs", routing_key=QUEUE, content_type="application/json"
        )
        channel = conn.channel()
        message = wait_for(lambda: channel.basic_get(QUEUE, no_ack=False), timeout_s=10)
        channel.basic_reject(message.delivery_info["delivery_tag"], requeue=False)
    result = app.send_task("dlx.ok", args=["twice"], expiration=0.1)
    wait_for(lambda: ready(vhost_url, deadletters.DEAD_QUEUE) == 2, timeout_s=20)
    assert copy_dead_messages(vhost_url, copies=2) == 2
    wait_for(lambda: ready(vhost_url, deadletters.DEAD_QUEUE) == 6, timeout_s=10)

    drains.start(app)
    drains.start(app)  # two workers' drains on one queue
    wait_drained(vhost_url)
    found = rows(db_url)
    assert sorted(r["reason"] for r in found) == ["expired", "poison"], found
    (expired,) = (r for r in found if r["reason"] == "expired")
    (poison,) = (r for r in found if r["reason"] == "poison")
    assert expired["task_id"] == result.id
    assert poison["task_id"] is None
    assert poison["raw_body_encoding"] == "base64"  # a NUL: kept byte for byte


# -- losing the broker, losing the database ----------------------------------------------------


def test_the_drain_comes_back_after_the_broker_closes_its_connection(
    app: Any, db_url: str, vhost_url: str, drains: Drains
) -> None:
    drain = drains.start(app)
    rabbitmqctl("close_all_connections", "-p", vhost_of(vhost_url), "test: drop the drain")
    wait_for(lambda: drain.sessions == 2, timeout_s=30, message="the drain to reconnect")
    result = app.send_task("dlx.ok", args=["after"], expiration=0.1)
    (row,) = wait_rows(db_url, 1)
    assert (row["reason"], row["task_id"]) == ("expired", result.id)


def test_with_the_database_down_the_letter_is_spooled_before_the_ack(
    vhost_url: str, redis_url: str, spool_key: str, drains: Drains
) -> None:
    down = "postgresql+psycopg://postgres@127.0.0.1:9/nothing"  # the discard port: refused
    app = make_app(
        vhost_url,
        broker_url=redis_url,
        database_url=down,
        dlq_spool_key=spool_key,
        dlq_write_attempts=1,
    )
    declare(app)
    drains.start(app)
    result = app.send_task("dlx.ok", args=["spooled"], expiration=0.1)
    client = redis.Redis.from_url(redis_url)
    try:
        (entry,) = wait_for(
            lambda: client.lrange(spool_key, 0, -1), timeout_s=20, message="a spooled letter"
        )
        letter = json.loads(entry)
        assert (letter["reason"], letter["task_id"]) == ("expired", result.id)
        wait_drained(vhost_url)  # acknowledged once spooled: the drainer writes it later
    finally:
        client.delete(spool_key)
        client.close()
