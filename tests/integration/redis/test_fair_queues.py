"""Fair queues on a private redis-server through the platform's transport, no worker.

Keyed messages land in their key's list and the ring (publish and bulk alike), the
kill-safe fetch takes them round robin across keys under the ``unacked`` bookkeeping of any
message, kombu's restores bring a fetched keyed message back (to the ordinary list), a
priority skips the ring, and the depth readers count the keyed backlog.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer, Queue
from kombu.transport import redis as kombu_redis
from kombu.utils.json import loads

from jobs_platform.brokers.interface import FAIRNESS_HEADER, FairKey
from jobs_platform.brokers.redis import fair, fetch, layout
from jobs_platform.testing import RedisServer

pytestmark = pytest.mark.integration

FAST = Queue("fast", Exchange("fast", type="direct"), routing_key="fast")
SEP = kombu_redis.Channel.sep
RING = f"fast{SEP}fair"
TRANSPORT = "jobs_platform.brokers.redis.transport:Transport"


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


def connect(url: str) -> Connection:
    return Connection(url, transport=TRANSPORT, transport_options={"visibility_timeout": 10})


def publish(conn: Connection, n: str, key: str | None, **kwargs: Any) -> None:
    headers = {} if key is None else {FAIRNESS_HEADER: key}
    Producer(conn.channel()).publish(
        {"n": n},
        exchange=FAST.exchange,
        routing_key="fast",
        declare=[FAST],
        headers=headers,
        **kwargs,
    )


def run_fetch(raw: redis.Redis, now: float = 1000.0) -> tuple[str, str, bytes | None] | None:
    """One fetch of queue fast (base list, then its ring), as a consumer sends it."""
    script = fetch.script_for(fetch.server_version(raw.info("server")["redis_version"]))
    assert script is not None
    owner = ("jobs:worker:held:o1", "jobs:worker:owners", "jobs:worker:alive:o1")
    keys = ["fast", RING, "unacked", "unacked_index", *owner]
    reply = raw.eval(script, len(keys), *keys, now, "o1", 15000, "1", "F")
    if reply is None:
        return None
    message = loads(reply[1])
    n = json.loads(base64.b64decode(message["body"]))["n"]
    return reply[0].decode(), n, reply[2]


def test_keyed_messages_are_taken_round_robin_across_the_keys_with_work(
    raw: redis.Redis, server: RedisServer
) -> None:
    with connect(server.url) as conn:
        for i in range(20):
            publish(conn, f"big-{i}", "big")
        for i in range(3):
            publish(conn, f"small-{i}", "small")
        publish(conn, "mid-0", "mid")
    assert raw.llen("fast") == 0  # nothing keyed in the ordinary list
    assert raw.lrange(RING, 0, -1) == [b"big", b"small", b"mid"]
    assert int(raw.get(f"{RING}#")) == 24
    assert layout.read_queues(raw, layout.BrokerLayout(queues=("fast",)))["fast"].length == 24

    order = []
    while (reply := run_fetch(raw)) is not None:
        key, n, tag = reply
        assert key == RING and tag is not None
        order.append(n)
    # One per key per round, each key's own oldest first.
    assert order[:7] == ["big-0", "small-0", "mid-0", "big-1", "small-1", "big-2", "small-2"]
    assert order[7:] == [f"big-{i}" for i in range(3, 20)]
    assert raw.hlen("unacked") == 24 and raw.zcard("unacked_index") == 24
    assert raw.scard("jobs:worker:held:o1") == 24
    # Drained: no ring, no key list, a zero count, a zero depth.
    assert not raw.exists(RING, f"{RING}:big", f"{RING}:small")
    assert int(raw.get(f"{RING}#")) == 0
    assert layout.read_queues(raw, layout.BrokerLayout(queues=("fast",)))["fast"].length == 0


def test_the_ordinary_list_ranks_first_and_a_priority_skips_the_ring(
    raw: redis.Redis, server: RedisServer
) -> None:
    with connect(server.url) as conn:
        publish(conn, "keyed", "t1")
        publish(conn, "plain", None)
        publish(conn, "urgent-keyed", "t1", priority=3)  # its priority list, as kombu's
    assert raw.llen(f"fast{SEP}3") == 1 and raw.llen(f"{RING}:t1") == 1
    assert [run_fetch(raw)[1] for _ in range(2)] == ["plain", "keyed"]  # type: ignore[index]
    assert run_fetch(raw) is None  # the fetch here looks at the base list and ring only


def test_a_fetched_keyed_message_of_a_killed_worker_is_restored_not_lost(
    raw: redis.Redis, server: RedisServer
) -> None:
    with connect(server.url) as conn:
        publish(conn, "a", "t1")
        publish(conn, "b", "t2")
    first = run_fetch(raw, now=1.0)  # long overdue: the "worker" died holding it
    assert first is not None and first[1] == "a"
    assert raw.hlen("unacked") == 1
    with Connection(server.url, transport_options={"visibility_timeout": 10}) as conn:
        conn.channel().qos.restore_visible(num=10, interval=1)
    assert raw.hlen("unacked") == 0
    # Back in the ordinary list (kombu's restore), so taken before the ring.
    assert [run_fetch(raw)[1] for _ in range(2)] == ["a", "b"]  # type: ignore[index]
    assert run_fetch(raw) is None


def test_a_stale_ring_head_is_dropped_and_the_next_key_served(
    raw: redis.Redis, server: RedisServer
) -> None:
    with connect(server.url) as conn:
        publish(conn, "gone", "t1")
        publish(conn, "kept", "t2")
    raw.delete(f"{RING}:t1")  # emptied by hand: the ring still names t1
    reply = run_fetch(raw)
    assert reply is not None and reply[1] == "kept"
    assert not raw.exists(RING)


def test_a_bulk_publish_queues_keyed_messages_in_the_ring(
    raw: redis.Redis, server: RedisServer
) -> None:
    with connect(server.url) as conn:
        channel = conn.channel()
        channel.exchange_declare("fast", type="direct")
        channel.queue_declare("fast")
        channel.queue_bind("fast", "fast", "fast")
        batch = channel.create_publish_batch(max_size=100)
        for i, key in enumerate(["x", "y", "x"]):
            message = channel.prepare_message(json.dumps({"n": i}), headers={FAIRNESS_HEADER: key})
            batch.publish(message, exchange="fast", routing_key="fast")
        batch.flush()
        batch.close()
    assert raw.lrange(RING, 0, -1) == [b"x", b"y"]
    assert raw.llen(f"{RING}:x") == 2 and int(raw.get(f"{RING}#")) == 3
    assert fair.keys_with_work(raw, {"fast": RING}) == [
        FairKey("fast", "x", 2, 0),
        FairKey("fast", "y", 1, 1),
    ]


def test_a_purge_of_the_queue_empties_its_key_lists_too(
    raw: redis.Redis, server: RedisServer
) -> None:
    with connect(server.url) as conn:
        publish(conn, "a", "t1")
        publish(conn, "b", "t2")
        publish(conn, "c", None)
        assert conn.channel().queue_purge("fast") == 3
    assert not raw.exists(RING, f"{RING}:t1", f"{RING}:t2", f"{RING}#", "fast")
