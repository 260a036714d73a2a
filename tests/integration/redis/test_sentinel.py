"""The platform's own clients of a ``sentinel://`` URL follow the master through a failover:
a graceful one (``SENTINEL FAILOVER``: the old master turns replica and refuses writes) and a
SIGKILL. A private master, one replica and three Sentinels on loopback
(:class:`jobs_platform.testing.sentinel.SentinelSet`); real worker processes under a
failover are tests/acceptance/test_sentinel_failover.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from jobs_platform import brokers, coordination, create_app
from jobs_platform.brokers.redis import options
from jobs_platform.testing import wait_for
from jobs_platform.testing.sentinel import SentinelSet

pytestmark = pytest.mark.integration


@pytest.fixture()
def deployment() -> Iterator[SentinelSet]:
    with SentinelSet(down_after_ms=1000, failover_timeout_ms=5000) as started:
        yield started


def test_the_platforms_clients_follow_the_master_through_two_failovers(
    deployment: SentinelSet,
) -> None:
    app = create_app("sentinelclients", broker_url=deployment.url(db=3))
    broker = brokers.of(app)
    client = coordination.client(app)  # the coordination client (here: the broker's Redis)
    store = broker.delayed_store(app)
    assert store is not None
    assert options.client_for(app) is client  # one client per URL in a process
    client.set("jptest:before", "1")
    first = deployment.master_port()
    ok, said = broker.ping(app.conf.broker_url, 2.0)
    assert ok, said
    assert "sentinel://127.0.0.1:" in said

    # 1. Graceful: the old master is demoted to a replica (READONLY to writes).
    deployment.failover()
    demoted = deployment.server_on(first or 0)
    second, _ = deployment.wait_failover(demoted)
    wait_for(lambda: _written(client, "jptest:graceful"), timeout_s=30, message="a write")
    assert deployment.role(second.port) == "master"
    assert client.get("jptest:before") == b"1"  # replicated before the graceful switch
    assert store.count() == 0  # the delayed store reads the new master

    # 2. SIGKILL of the new master: the Sentinels promote the demoted one back.
    killed = deployment.kill_master()
    third, _ = deployment.wait_failover(killed)
    wait_for(lambda: _written(client, "jptest:killed"), timeout_s=30, message="a write")
    assert third.port == demoted.port
    assert client.get("jptest:graceful") == b"1"
    states = broker.queue_states(app, ["fast"])
    assert states["fast"].length == 0
    ok, said = broker.ping(app.conf.broker_url, 2.0)
    assert ok, said


def _written(client: object, key: str) -> bool:
    import redis

    try:
        return bool(client.set(key, "1"))  # type: ignore[attr-defined]
    except redis.RedisError:
        return False
