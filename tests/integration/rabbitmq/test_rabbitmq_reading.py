"""Reading the RabbitMQ broker over AMQP, and bulk dispatch on it, in a vhost of its own."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs_platform import ReliableTask, create_app
from jobs_platform.brokers.rabbitmq import BROKER
from jobs_platform.brokers.rabbitmq.startup import check_and_declare
from jobs_platform.testing import free_port, wait_for
from jobs_platform.testing.rabbitmq import available, rabbitmq_vhost

pytestmark = pytest.mark.skipif(not available(), reason="RabbitMQ does not answer")


@pytest.fixture()
def app(redis_url: str, sqlite_url: str) -> Iterator[Any]:
    with rabbitmq_vhost() as url:
        made = create_app(
            "rmqreading", broker_url=url, coordination_url=redis_url, database_url=sqlite_url
        )

        @made.task(base=ReliableTask, name="rmqreading.job", queue="fast", time_limit=10)
        def job(n: int) -> int:
            return n

        check_and_declare(made)  # what a worker does at start
        yield made


def test_depths_come_from_passive_declares_and_the_oldest_age_is_unknown(app: Any) -> None:
    for n in range(3):
        app.tasks["rmqreading.job"].delay(n)
    states = BROKER.queue_states(app, ["fast", "heavy", "not-declared"])
    assert {q: s.length for q, s in states.items()} == {"fast": 3, "heavy": 0, "not-declared": 0}
    assert all(s.oldest_enqueued_at is None for s in states.values())


def test_ping_answers_and_a_closed_port_does_not(app: Any) -> None:
    ok, said = BROKER.ping(str(app.conf.broker_url), 2.0)
    assert ok, said
    dead = f"amqp://guest:guest@127.0.0.1:{free_port()}//"
    ok, said = BROKER.ping(dead, 1.0)
    assert not ok and "does not answer" in said
    ok, said = BROKER.ping(f"{dead};{app.conf.broker_url}", 2.0)  # the next node answers
    assert ok, said


def test_a_bulk_with_countdowns_routes_each_copy_through_its_own_delay(app: Any) -> None:
    job = app.tasks["rmqreading.job"]
    results = job.apply_async_many([job.s(n).set(countdown=0.2 if n % 2 else 3) for n in range(6)])
    assert len(results) == 6

    def ready() -> int:  # a passive declare: exact (rabbitmqctl's counts lag for quorum queues)
        return BROKER.queue_states(app, ["fast"])["fast"].length

    # The three 0.2 s copies arrive after 1 s (rounded up), the three 3 s ones later.
    wait_for(lambda: ready() == 3 or None, timeout_s=10, message="the 1 s copies")
    assert ready() == 3  # the 3 s copies still wait
    wait_for(lambda: ready() == 6 or None, timeout_s=15, message="the 3 s copies")


def test_the_exporter_reads_depths_and_leaves_out_what_the_broker_cannot_tell(app: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from jobs_platform.exporter.collector import JobsCollector
    from jobs_platform.exporter.sources import Sources

    app.tasks["rmqreading.job"].delay(1)
    registry = CollectorRegistry()
    registry.register(JobsCollector(Sources.from_app(app)))
    text = generate_latest(registry).decode()
    lengths = [line for line in text.splitlines() if line.startswith("celery_queue_length{")]
    assert 'celery_queue_length{queue_name="fast"} 1.0' in lengths, lengths
    assert "jobs_inflight{" not in text  # unknown without the management API: no sample
