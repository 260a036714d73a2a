"""The broker is chosen by the URL's scheme, and answers for what the rest of the platform
asks of it (pure: no server; what needs one is in the integration and acceptance tiers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import redis

from jobs_platform import brokers, create_app
from jobs_platform.brokers.memory import MemoryBroker
from jobs_platform.brokers.redis import RedisBroker
from jobs_platform.errors import ConfigError
from jobs_platform.settings import Settings


def test_the_scheme_chooses_the_broker() -> None:
    assert isinstance(brokers.for_url("redis://h:6379/0"), RedisBroker)
    assert isinstance(brokers.for_url("rediss://h:6380/0"), RedisBroker)
    assert isinstance(brokers.for_url("memory://"), MemoryBroker)
    app = create_app("chosen", broker_url="redis://127.0.0.1:6399/0")
    assert brokers.of(app) is brokers.for_url("redis://127.0.0.1:6399/0")


def test_the_redis_broker_checks_the_rest_of_its_urls_shape() -> None:
    # The scheme is the rules' (tests/unit/test_new_user_defects.py); the shape the broker's.
    with pytest.raises(ConfigError, match="JOBS_BROKER_URL='redis://h:0/0': port 0"):
        brokers.check_broker_url("redis://h:0/0", setting="JOBS_BROKER_URL")


def test_the_delivery_timeout_on_redis_is_the_visibility_timeout() -> None:
    timeout = RedisBroker().delivery_timeout(Settings(visibility_timeout=120.0))
    assert (timeout.name, timeout.setting, timeout.seconds) == (
        "visibility timeout",
        "JOBS_VISIBILITY_TIMEOUT",
        120.0,
    )


def test_a_live_visibility_timeout_changed_behind_our_back_is_refused() -> None:
    app = SimpleNamespace(
        conf=SimpleNamespace(broker_transport_options={"visibility_timeout": 30}),
        jobs_settings=Settings(),
    )
    with pytest.raises(ConfigError, match="differs from JOBS_VISIBILITY_TIMEOUT"):
        RedisBroker().check_live(app)


def test_broker_down_is_redis_pys_connection_and_timeout_errors() -> None:
    broker = RedisBroker()
    assert broker.is_down(redis.ConnectionError("refused"))
    assert broker.is_down(redis.TimeoutError("slow"))
    assert not broker.is_down(redis.ResponseError("WRONGTYPE"))
    assert not broker.is_down(ValueError("x"))


def test_an_unreachable_redis_does_not_answer_a_ping_in_time() -> None:
    ok, said = RedisBroker().ping("redis://:s3cret@127.0.0.1:1/0", 0.5)
    assert not ok and "does not answer" in said and "s3cret" not in said


def test_the_in_process_broker_has_no_store_no_plug_ins_and_empty_queues() -> None:
    app = create_app("inproc", broker_url="memory://")
    broker = brokers.of(app)
    assert broker.delayed_store(app) is None and broker.restore_sweep(app) is None
    assert broker.inflight(app) is None
    assert broker.queue_states(app, ["fast"])["fast"].length == 0
    with pytest.raises(ConfigError, match="memory://"):
        broker.check_url("memory://x", setting="JOBS_BROKER_URL")
