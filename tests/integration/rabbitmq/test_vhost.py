"""The RabbitMQ tier's isolation: each test gets a vhost of its own, gone after it."""

from __future__ import annotations

import kombu

from jobs_platform.testing.rabbitmq import flush, list_queues, rabbitmq_vhost, rabbitmqctl


def test_a_vhost_of_its_own_holds_the_tests_queues_and_is_deleted_after_it() -> None:
    with rabbitmq_vhost() as url:
        name = url.rsplit("/", 1)[1]
        with kombu.Connection(url) as conn:
            queue = kombu.Queue(
                "q1",
                kombu.Exchange("x", type="topic"),
                routing_key="q1",
                queue_arguments={"x-queue-type": "quorum"},
            )
            queue(conn.default_channel).declare()
        assert list_queues(name) == [{"name": "q1", "type": "quorum", "messages": "0"}]
    assert name in rabbitmqctl("list_vhosts").split()  # doomed, deleted with its batch
    flush()
    assert name not in rabbitmqctl("list_vhosts").split()
