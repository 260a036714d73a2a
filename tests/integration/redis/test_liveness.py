"""Worker leases on a private redis-server, through kombu and the platform's transport, no
worker (jobs_platform/brokers/redis/liveness.py): what an owner holds follows its fetches
and acks; a dead owner's jobs go back once, however many workers race to put them back;
a live owner's are never swept, and a job only waiting for its ETA is not a lost attempt.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from jobs_platform import history
from jobs_platform.brokers.redis import liveness
from jobs_platform.brokers.redis.transport import Transport
from jobs_platform.testing import RedisServer, wait_for

pytestmark = pytest.mark.integration

FAST = Queue("fast", Exchange("fast", type="direct"), routing_key="fast")
OPTIONS = {"visibility_timeout": 3600, "jobs_worker_lease": 1.0}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


@pytest.fixture()
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    yield client
    client.close()


def connect(server: RedisServer, **options: Any) -> Connection:
    return Connection(server.url, transport=Transport, transport_options={**OPTIONS, **options})


def publish(server: RedisServer, count: int, **kwargs: Any) -> None:
    with Connection(server.url) as conn:
        producer = Producer(conn.channel())
        for n in range(count):
            producer.publish(
                {"n": n},
                exchange=FAST.exchange,
                routing_key="fast",
                declare=[FAST],
                headers={"id": f"job-{n}", **kwargs.pop("headers", {})},
                **kwargs,
            )


def take(conn: Connection, count: int) -> tuple[Any, list[Any]]:
    """Fetch ``count`` messages on a channel of ``conn`` and hold them (no ack)."""
    channel = conn.channel()
    channel.basic_qos(prefetch_count=count)
    got: list[Any] = []
    consumer = Consumer(channel, [FAST], callbacks=[lambda body, m: got.append(m)])
    consumer.consume()

    def step() -> bool:
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=0.5)
        return len(got) >= count

    wait_for(step, timeout_s=10, message=f"{count} deliveries")
    return channel, got


def test_an_owner_holds_what_it_fetched_until_it_acks(
    raw: redis.Redis, server: RedisServer
) -> None:
    publish(server, 3)
    with connect(server) as conn:
        channel, got = take(conn, 3)
        held = liveness.held_key("", channel.jobs_owner)
        assert raw.smembers(held) == set(raw.hkeys("unacked")) and raw.scard(held) == 3
        assert raw.exists(liveness.alive_key("", channel.jobs_owner))
        for message in got[:2]:
            message.ack()
        assert raw.smembers(held) == set(raw.hkeys("unacked")) and raw.scard(held) == 1
        got[2].reject(requeue=True)  # back on its queue: no longer held
        assert raw.scard(held) == 0 and raw.llen("fast") == 1


def test_the_upkeep_keeps_a_live_owners_jobs_out_of_the_visibility_sweep(
    raw: redis.Redis, server: RedisServer
) -> None:
    publish(server, 2)
    with connect(server, visibility_timeout=2) as conn:
        channel, _got = take(conn, 2)
        raw.zadd("unacked_index", dict.fromkeys(raw.hkeys("unacked"), 0), xx=True)  # "old"
        channel.qos.restore_visible(num=10, interval=1)  # the upkeep first, then kombu's sweep
        assert raw.hlen("unacked") == 2 and raw.llen("fast") == 0
        assert all(
            score > time.time() - 5
            for _, score in raw.zrange("unacked_index", 0, -1, withscores=True)
        )


def test_a_dead_owners_jobs_go_back_once_whoever_races_to_put_them_back(
    raw: redis.Redis, server: RedisServer
) -> None:
    publish(server, 40)
    dead = connect(server)
    channel, _held = take(dead, 40)
    owner = channel.jobs_owner
    raw.delete(liveness.alive_key("", owner))  # its lease ran out: the worker is gone
    restorers = [connect(server) for _ in range(8)]
    barrier = threading.Barrier(len(restorers))
    put_back: list[int] = []

    def upkeep(conn: Connection) -> None:
        qos = conn.channel().qos
        barrier.wait()
        put_back.append(qos.jobs_upkeep())

    threads = [threading.Thread(target=upkeep, args=(conn,)) for conn in restorers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for conn in restorers:
        conn.release()
    items = [json.loads(item) for item in raw.lrange("fast", 0, -1)]
    assert sum(put_back) == 40 and sorted(put_back, reverse=True)[1:] == [0] * 7
    assert sorted(m["headers"]["id"] for m in items) == sorted(f"job-{n}" for n in range(40))
    assert all(m["headers"][history.LOST_WORKER_HEADER] == owner for m in items)
    assert all(m["headers"]["redelivered"] for m in items)
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    assert not raw.sismember(liveness.OWNERS_KEY, owner)
    assert not raw.exists(liveness.held_key("", owner))
    dead.release()


def test_a_lease_that_lapses_by_itself_frees_its_jobs(
    raw: redis.Redis, server: RedisServer
) -> None:
    publish(server, 1)
    dead = connect(server)  # a 1 s lease, never renewed again
    take(dead, 1)
    with connect(server) as live:
        qos = live.channel().qos
        assert wait_for(lambda: qos.jobs_upkeep(), timeout_s=10, interval_s=0.2) == 1
    assert raw.llen("fast") == 1
    dead.release()


def test_a_job_waiting_for_its_eta_is_put_back_unmarked(
    raw: redis.Redis, server: RedisServer
) -> None:
    future = "2999-01-01T00:00:00+00:00"
    publish(server, 1, headers={"eta": future})
    dead = connect(server)
    channel, _ = take(dead, 1)
    raw.delete(liveness.alive_key("", channel.jobs_owner))
    with connect(server) as live:
        assert live.channel().qos.jobs_upkeep() == 1
    [item] = [json.loads(i) for i in raw.lrange("fast", 0, -1)]
    assert item["headers"]["eta"] == future
    assert history.LOST_WORKER_HEADER not in item["headers"]  # it could not have been running
    dead.release()
