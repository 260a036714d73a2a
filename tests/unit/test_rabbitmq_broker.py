"""The RabbitMQ broker's configuration, rules and pure parts (no broker is contacted)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from amqp.exceptions import ConnectionForced, NotFound, PreconditionFailed

from jobs_platform import ReliableTask, brokers, create_app
from jobs_platform.brokers.rabbitmq import BROKER, declare, delays, topology
from jobs_platform.errors import ConfigError, DispatchError
from jobs_platform.settings import Settings

URL = "amqp://guest:guest@127.0.0.1:5672/jobs"
COORDINATION = "redis://127.0.0.1:6379/3"


def app_on_rabbitmq(**overrides: Any) -> Any:
    return create_app(
        "rmqunit",
        **{"broker_url": URL, "coordination_url": COORDINATION, **overrides},
    )


# -- delays ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wait", "whole"),
    [(2.4, 3), (0.3, 1), (0.0, 0), (-4.0, 0), (3.0, 3), (1.0000000001, 1), (12, 12)],
)
def test_a_wait_is_rounded_up_to_whole_seconds_and_never_below_one(wait: float, whole: int) -> None:
    assert delays.whole_seconds(wait) == whole


def test_an_eta_becomes_the_countdown_to_it_rounded_up_and_a_past_one_no_delay() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    later = now + dt.timedelta(seconds=7.2)
    assert delays.rounded({"eta": later, "queue": "fast"}, now) == {
        "countdown": 8,
        "queue": "fast",
    }
    assert delays.rounded({"eta": (now - dt.timedelta(seconds=1)).isoformat()}, now) == {}
    assert delays.rounded({"countdown": 0.3}, now) == {"countdown": 1}
    assert delays.rounded({"queue": "fast"}, now) == {"queue": "fast"}


def test_a_delivered_routing_key_loses_the_delay_prefix() -> None:
    prefixed = ".".join("0" * 26 + "11") + ".fast"
    assert delays.queue_key(prefixed) == "fast"
    assert delays.queue_key("fast") == "fast"


# -- settings and configuration --------------------------------------------------------------


def test_an_amqp_broker_without_a_coordination_redis_is_refused() -> None:
    with pytest.raises(ConfigError, match="JOBS_COORDINATION_URL must name one"):
        Settings(broker_url=URL)


def test_results_go_to_the_coordination_redis_unless_set() -> None:
    assert Settings(broker_url=URL, coordination_url=COORDINATION).result_backend_url == (
        COORDINATION
    )
    assert (
        Settings(
            broker_url=URL, coordination_url=COORDINATION, result_backend="rpc://"
        ).result_backend_url
        == "rpc://"
    )
    assert Settings().result_backend_url == Settings().broker_url  # Redis: unchanged


def test_a_failover_list_of_nodes_is_accepted_and_each_url_checked() -> None:
    nodes = "amqp://guest:guest@127.0.0.1:5691//;amqps://guest:guest@127.0.0.1:5692//"
    assert brokers.for_url(nodes) is BROKER
    Settings(broker_url=nodes, coordination_url=COORDINATION)
    with pytest.raises(ConfigError, match="every URL of a failover list"):
        Settings(broker_url=URL + ";redis://127.0.0.1:6379/0", coordination_url=COORDINATION)
    with pytest.raises(ConfigError, match="one vhost name"):
        Settings(broker_url="amqp://h:5672/a/b", coordination_url=COORDINATION)


def test_delivery_limit_and_consumer_timeout_are_checked() -> None:
    with pytest.raises(ConfigError, match="delivery_limit"):
        Settings(delivery_limit=0)
    with pytest.raises(ConfigError, match="rabbitmq_consumer_timeout"):
        Settings(rabbitmq_consumer_timeout=30.0)  # below the 60 s margin


def test_every_queue_is_quorum_on_a_topic_exchange_with_the_dead_letter_contract() -> None:
    app = app_on_rabbitmq(delivery_limit=7)
    assert app.conf.broker_transport_options == {"confirm_publish": True}
    queues = {q.name: q for q in app.conf.task_queues}
    assert set(queues) == {"fast", "heavy", "thirdparty"}
    for queue in queues.values():
        assert queue.exchange.type == "topic"
        assert queue.queue_arguments == {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "jobs.dead",
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": 7,
        }
    dead = declare.dead_letter_queue()
    assert (dead.name, dead.exchange.name, dead.exchange.type) == ("jobs.dead",) * 2 + ("fanout",)
    assert dead.queue_arguments == {"x-queue-type": "quorum"}
    assert BROKER.delayed_store(app) is None and BROKER.inflight(app) is None


# -- rules that need the broker ----------------------------------------------------------------


def test_a_hard_limit_that_does_not_fit_the_consumer_timeout_is_refused() -> None:
    app = app_on_rabbitmq(rabbitmq_consumer_timeout=700.0)
    with pytest.raises(ConfigError, match="consumer timeout"):

        @app.task(base=ReliableTask, name="rmqunit.long", queue="heavy", time_limit=650)
        def long() -> None: ...

    @app.task(base=ReliableTask, name="rmqunit.short", queue="heavy", time_limit=500)
    def short() -> None: ...


def test_a_priority_is_refused_at_finalize_and_at_dispatch() -> None:
    app = app_on_rabbitmq()

    @app.task(base=ReliableTask, name="rmqunit.plain", queue="fast", time_limit=10)
    def plain() -> None: ...

    with pytest.raises(DispatchError, match="one priority level"):
        plain.apply_async(priority=3)

    @app.task(base=ReliableTask, name="rmqunit.urgent", queue="fast", priority=5, time_limit=10)
    def urgent() -> None: ...

    with pytest.raises(ConfigError, match=r"task 'rmqunit.urgent': priority=5 is refused"):
        app.finalize()


def test_a_fairness_key_is_refused_with_the_reason() -> None:
    app = app_on_rabbitmq()
    with pytest.raises(ConfigError, match="round robin across keys"):

        @app.task(
            base=ReliableTask,
            name="rmqunit.fair",
            queue="fast",
            time_limit=10,
            fairness_key=lambda tenant: tenant,
        )
        def fair(tenant: str) -> None: ...


# -- reading errors -------------------------------------------------------------------------


def test_is_down_names_lost_connections_not_refusals() -> None:
    assert BROKER.is_down(ConnectionForced("shutdown"))
    assert BROKER.is_down(ConnectionRefusedError())
    assert not BROKER.is_down(NotFound("no exchange"))
    assert not BROKER.is_down(ValueError())


def test_an_inequivalent_argument_is_described_with_how_to_migrate() -> None:
    error = PreconditionFailed(
        "PRECONDITION_FAILED - inequivalent arg 'x-delivery-limit' for queue 'fast' in vhost "
        "'prod': received the value '10' of type 'signedint' but current is the value '20' of "
        "type 'signedint'"
    )
    said = declare.describe(error, "prod")
    assert "queue 'fast' exists with another argument x-delivery-limit" in said
    assert "new vhost" in said and "rabbitmqctl delete_queue -p prod fast" in said
    assert topology.DEAD_EXCHANGE == topology.DEAD_QUEUE == "jobs.dead"


def test_the_rabbitmq_consumer_leaves_out_only_celerys_per_reconnect_delayed_delivery() -> None:
    from celery.worker.consumer import Consumer as CeleryConsumer

    from jobs_platform.brokers.rabbitmq import consumer

    assert consumer.CELERY_DELAYED_DELIVERY_STEP in CeleryConsumer.Blueprint.default_steps
    kept = set(consumer.Consumer.Blueprint.default_steps)
    assert kept == set(CeleryConsumer.Blueprint.default_steps) - {
        consumer.CELERY_DELAYED_DELIVERY_STEP
    }


def test_a_republished_message_leaves_the_brokers_death_record_behind() -> None:
    # A copy that expires again in a delay queue it already expired in is a dead-letter
    # cycle RabbitMQ drops without a trace (a retry waiting 1 s, then 3 s).
    from jobs_platform.brokers.rabbitmq.dispatch import DEATH_HEADERS, without_deaths

    headers = {name: "x" for name in DEATH_HEADERS} | {"jobs_attempts": 2, "x-custom": 1}
    options = {"headers": headers, "queue": "fast"}
    cleaned = without_deaths(options)
    assert cleaned == {"headers": {"jobs_attempts": 2, "x-custom": 1}, "queue": "fast"}
    assert options["headers"] == headers  # the caller's options are not changed
    plain = {"headers": {"jobs_attempts": 1}}
    assert without_deaths(plain) is plain
