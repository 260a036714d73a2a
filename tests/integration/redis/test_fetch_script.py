"""The kill-safe fetch on a private redis-server, with kombu's own QoS and no worker.

The script alone (priority order, the ``unacked`` entry kombu's ``QoS.append`` would write,
kombu's restores bringing a fetched message back, raw items popped and handed back), then
the channel consuming through kombu (``drain_events``): recorded before the callback runs
and written once, priority sub-lists and other queues reached, a key prefix, a flushed
script cache, a refusing hook, a full ``noeviction`` server, and an older server.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps, loads

from jobs_platform.brokers.redis import fetch
from jobs_platform.brokers.redis.fetch import KillSafeFetch
from jobs_platform.testing import RedisServer, wait_for

pytestmark = pytest.mark.integration

FAST = Queue("fast", Exchange("fast", type="direct"), routing_key="fast")
HEAVY = Queue("heavy", Exchange("heavy", type="direct"), routing_key="heavy")
SEP = kombu_redis.Channel.sep
STEPS = kombu_redis.PRIORITY_STEPS


def list_of(queue: str, priority: int) -> str:
    """kombu's list for a queue and priority step."""
    return f"{queue}{SEP}{priority}" if priority else queue


def _body(message: dict[str, Any]) -> bytes:
    return base64.b64decode(message["body"])


class Channel(KillSafeFetch):
    """The mixin alone on kombu's channel."""


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


class RefusingChannel(KillSafeFetch):
    """Refuses every item (as a poison screen does), keeping what it was handed."""

    refused: list[tuple[str, bytes]] = []

    def kill_safe_admit(self, key: str, item: bytes) -> bool:
        self.refused.append((key, item))
        return False


class RefusingTransport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = RefusingChannel


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


@pytest.fixture()
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    client.config_resetstat()
    yield client
    client.config_set("maxmemory", "0")
    client.close()


def publish(url: str, queue: Queue, body: Any, **kwargs: Any) -> None:
    """Publish as any producer does: kombu's own Redis transport."""
    with Connection(url) as conn:
        Producer(conn.channel()).publish(
            body, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue], **kwargs
        )


def run_fetch(
    raw: redis.Redis, lists: list[str], now: float = 1000.0
) -> tuple[bytes, bytes, bytes | None] | None:
    script = fetch.script_for(fetch.server_version(raw.info("server")["redis_version"]))
    assert script is not None
    owner = ("jobs:worker:held:o1", "jobs:worker:owners", "jobs:worker:alive:o1")
    keys = [*lists, "unacked", "unacked_index", *owner]
    reply = raw.eval(script, len(keys), *keys, now, "o1", 15000, *["1"] * len(lists))
    return None if reply is None else (reply[0], reply[1], reply[2])


def drain(conn: Connection, done: Any, timeout_s: float = 10) -> None:
    def step() -> bool:
        with contextlib.suppress(TimeoutError):  # nothing this round: poll again
            conn.drain_events(timeout=0.5)
        return bool(done())

    wait_for(step, timeout_s=timeout_s, message="the deliveries")


# -- the script ------------------------------------------------------------------------------


def test_the_fetch_takes_lists_in_kombus_order_and_records_what_qos_append_writes(
    raw: redis.Redis, server: RedisServer
) -> None:
    publish(server.url, FAST, {"n": "fast-9"}, priority=9)
    publish(server.url, FAST, {"n": "fast-0"})
    publish(server.url, FAST, {"n": "fast-3"}, priority=3)
    publish(server.url, HEAVY, {"n": "heavy-0"})
    lists = fetch.fetch_lists(["fast", "heavy"], list_of, STEPS)
    assert lists[:3] == ["fast", "heavy", f"fast{SEP}3"]

    order = []
    while (reply := run_fetch(raw, lists, now=1234.5)) is not None:
        key, item, tag = reply
        message = loads(item)
        order.append((key.decode(), json.loads(_body(message))["n"]))
        assert tag is not None and tag.decode() == message["properties"]["delivery_tag"]
        # What kombu's QoS.append would have written for this message, as JSON values.
        info = message["properties"]["delivery_info"]
        kombu_entry = dumps([message, info["exchange"], info["routing_key"]])
        assert loads(raw.hget("unacked", tag)) == loads(kombu_entry)
        assert raw.zscore("unacked_index", tag) == 1234.5
    assert order == [
        ("fast", "fast-0"),
        ("heavy", "heavy-0"),
        (f"fast{SEP}3", "fast-3"),
        (f"fast{SEP}9", "fast-9"),
    ]
    assert raw.hlen("unacked") == 4 and raw.zcard("unacked_index") == 4
    assert not any(raw.exists(key) for key in lists)
    # Each one held by the fetching owner, whose lease the fetch renewed (liveness.py).
    assert raw.smembers("jobs:worker:held:o1") == set(raw.hkeys("unacked"))
    assert raw.smembers("jobs:worker:owners") == {b"o1"}
    assert 14_000 < raw.pttl("jobs:worker:alive:o1") <= 15_000


def test_kombus_restores_put_a_fetched_message_back_in_its_priority_list(
    raw: redis.Redis, server: RedisServer
) -> None:
    publish(server.url, FAST, {"n": 1}, priority=6)
    publish(server.url, FAST, {"n": 2})
    original = {key: raw.lrange(key, 0, -1)[0] for key in ("fast", f"fast{SEP}6")}
    lists = fetch.fetch_lists(["fast"], list_of, STEPS)
    fetched = [run_fetch(raw, lists, now=time.time() - 100) for _ in range(2)]
    assert raw.llen("fast") == 0 and raw.llen(f"fast{SEP}6") == 0

    with Connection(server.url, transport_options={"visibility_timeout": 10}) as conn:
        channel = conn.channel()
        first = fetched[0]
        assert first is not None
        channel.qos.restore_by_tag(first[2])  # one by tag...
        channel.qos.restore_visible(num=10, interval=1)  # ...the other as overdue
    for key, item in original.items():
        [back] = raw.lrange(key, 0, -1)
        expected = loads(item)
        expected["headers"]["redelivered"] = True
        expected["properties"]["delivery_info"]["redelivered"] = True
        assert loads(back) == expected
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0


@pytest.mark.parametrize(
    "item",
    [
        b"\xffnot json",
        b'{"body": "x"}',  # JSON, no properties
        b'{"properties": {"delivery_tag": "t1", "delivery_info": {"exchange": ""}}}',
        b"[1, 2]",
    ],
)
def test_an_item_that_is_not_an_envelope_is_popped_and_returned_raw_unrecorded(
    raw: redis.Redis, item: bytes
) -> None:
    raw.lpush("fast", b"next")
    raw.rpush("fast", item)  # at the tail: taken first
    assert run_fetch(raw, ["fast"]) == (b"fast", item, None)
    assert raw.lrange("fast", 0, -1) == [b"next"]
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    assert not raw.exists("jobs:worker:held:o1", "jobs:worker:owners")


def test_empty_lists_give_nothing_and_change_nothing(raw: redis.Redis) -> None:
    assert run_fetch(raw, ["fast", f"fast{SEP}3"]) is None
    assert raw.dbsize() == 0


# -- the channel, through kombu ----------------------------------------------------------------


def test_a_delivered_message_is_in_unacked_before_the_callback_and_written_once(
    raw: redis.Redis, server: RedisServer
) -> None:
    seen: list[tuple[Any, bool]] = []
    with Connection(server.url, transport=Transport) as conn:
        channel = conn.channel()

        def callback(body: Any, message: Any) -> None:
            seen.append((body, raw.hexists("unacked", message.delivery_tag)))
            message.ack()

        with Consumer(channel, [FAST], callbacks=[callback]):
            for n in range(3):
                publish(server.url, FAST, {"n": n})
            drain(conn, lambda: len(seen) == 3)
    assert seen == [({"n": n}, True) for n in range(3)]
    stats = raw.info("commandstats")
    assert stats["cmdstat_hset"]["calls"] == 3  # the script's; QoS.append wrote nothing
    assert "cmdstat_brpop" not in stats
    assert raw.hlen("unacked") == 0  # acknowledged


def test_a_consumer_that_takes_no_acks_leaves_nothing_in_unacked(
    raw: redis.Redis, server: RedisServer
) -> None:
    # What a control reply queue is (celery inspect, health): kombu records none of it.
    publish(server.url, FAST, {"n": 1})
    got: list[Any] = []
    with Connection(server.url, transport=Transport) as conn:
        channel = conn.channel()
        with Consumer(channel, [FAST], callbacks=[lambda b, m: got.append(b)], no_ack=True):
            drain(conn, lambda: got)
    assert got == [{"n": 1}]
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    assert not raw.keys("jobs:worker:held:*")


def test_a_priority_message_and_another_queue_reach_an_idle_consumer(
    raw: redis.Redis, server: RedisServer
) -> None:
    got: list[Any] = []
    with Connection(server.url, transport=Transport) as conn:
        channel = conn.channel()
        callbacks = [lambda body, message: (got.append(body), message.ack())]
        with Consumer(channel, [FAST, HEAVY], callbacks=callbacks):
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=1.5)  # idle: now blocking on one base list
            publish(server.url, FAST, {"n": "priority"}, priority=9)
            publish(server.url, HEAVY, {"n": "heavy"})
            drain(conn, lambda: len(got) == 2)
    assert sorted(body["n"] for body in got) == ["heavy", "priority"]


def test_a_message_not_acknowledged_is_restored_when_the_channel_closes(
    raw: redis.Redis, server: RedisServer
) -> None:
    got: list[Any] = []
    publish(server.url, FAST, {"n": "kept"}, priority=3)
    with Connection(server.url, transport=Transport) as conn:
        with Consumer(conn.channel(), [FAST], callbacks=[lambda body, m: got.append(body)]):
            drain(conn, lambda: got)
        assert raw.hlen("unacked") == 1
    [back] = raw.lrange(f"fast{SEP}3", 0, -1)
    assert loads(back)["headers"]["redelivered"] is True
    assert raw.hlen("unacked") == 0


def test_with_a_global_key_prefix_every_key_is_prefixed(
    raw: redis.Redis, server: RedisServer
) -> None:
    got: list[Any] = []
    options = {"global_keyprefix": "pfx:"}
    with Connection(server.url, transport=Transport, transport_options=options) as conn:
        channel = conn.channel()
        with Consumer(channel, [FAST], callbacks=[lambda body, m: got.append((body, m))]):
            Producer(channel).publish({"n": 1}, exchange=FAST.exchange, routing_key="fast")
            drain(conn, lambda: got)
            [(body, message)] = got
            assert body == {"n": 1} and message.delivery_info["routing_key"] == "fast"
            assert raw.hexists("pfx:unacked", message.delivery_tag)
            assert raw.zscore("pfx:unacked_index", message.delivery_tag) is not None
            message.ack()
    assert not raw.exists("unacked") and raw.hlen("pfx:unacked") == 0


def test_a_flushed_script_cache_is_reloaded(raw: redis.Redis, server: RedisServer) -> None:
    got: list[Any] = []
    with (
        Connection(server.url, transport=Transport) as conn,
        Consumer(conn.channel(), [FAST], callbacks=[lambda b, m: (got.append(b), m.ack())]),
    ):
        publish(server.url, FAST, {"n": 1})
        drain(conn, lambda: got)
        raw.script_flush()  # as a restarted server would have
        publish(server.url, FAST, {"n": 2})
        drain(conn, lambda: len(got) == 2)
    assert got == [{"n": 1}, {"n": 2}]


def test_a_refused_item_leaves_no_unacked_entry_and_the_next_message_is_delivered(
    raw: redis.Redis, server: RedisServer
) -> None:
    RefusingChannel.refused = []
    publish(server.url, FAST, {"n": "refused"})
    with (
        Connection(server.url, transport=RefusingTransport) as conn,
        Consumer(conn.channel(), [FAST], callbacks=[lambda b, m: None]),
    ):
        drain(conn, lambda: RefusingChannel.refused)
    [(key, item)] = RefusingChannel.refused
    assert key == "fast" and json.loads(_body(loads(item))) == {"n": "refused"}
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0
    assert raw.llen("fast") == 0


def test_an_item_python_cannot_read_raises_as_before_and_is_not_kept(
    raw: redis.Redis, server: RedisServer
) -> None:
    # cjson reads hexadecimal numbers, JSON (and kombu) does not: recorded, then dropped.
    info = b'"delivery_info": {"exchange": "", "routing_key": "fast"}'
    raw.lpush("fast", b'{"properties": {"delivery_tag": "t1", ' + info + b'}, "n": 0x10}')
    with (
        Connection(server.url, transport=Transport) as conn,
        Consumer(conn.channel(), [FAST], callbacks=[lambda b, m: None]),
        pytest.raises(ValueError),
    ):
        for _ in range(5):
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.5)
    assert raw.llen("fast") == 0 and raw.hlen("unacked") == 0


def test_a_server_out_of_memory_keeps_consuming(
    raw: redis.Redis, server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    got: list[Any] = []  # not acknowledged: kombu's acks are refused on a full server too
    for n in range(3):
        publish(server.url, FAST, {"n": n})
    with (
        caplog.at_level(logging.WARNING, "jobs_platform.brokers.redis.fetch"),
        Connection(server.url, transport=Transport) as conn,
        Consumer(conn.channel(), [FAST], callbacks=[lambda b, m: got.append(b)]),
    ):
        drain(conn, lambda: got)  # the first one, fetched before memory ran out
        raw.config_set("maxmemory-policy", "noeviction")
        raw.config_set("maxmemory", "1")  # from now on writes are refused...
        drain(conn, lambda: len(got) == 3)  # ...yet the fetch script still runs
        with contextlib.suppress(TimeoutError):
            conn.drain_events(timeout=1.5)  # idle: BLMOVE refused, kombu's BRPOP used
        raw.config_set("maxmemory", "0")
        publish(server.url, FAST, {"n": 3})
        drain(conn, lambda: len(got) == 4)
        assert raw.hlen("unacked") == 4  # every one recorded, under the limit or not
    assert [body["n"] for body in got] == [0, 1, 2, 3]
    stats = raw.info("commandstats")
    assert stats["cmdstat_blmove"]["rejected_calls"] >= 1
    assert stats["cmdstat_brpop"]["calls"] >= 1
    assert any("jobs.fetch.out_of_memory" in r.getMessage() for r in caplog.records)


def test_an_older_server_gets_kombus_brpop_and_a_warning(
    raw: redis.Redis,
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(fetch, "server_version", lambda text: (6, 0, 9))
    got: list[Any] = []
    with (
        caplog.at_level(logging.WARNING, "jobs_platform.brokers.redis.fetch"),
        Connection(server.url, transport=Transport) as conn,
        Consumer(conn.channel(), [FAST], callbacks=[lambda b, m: (got.append(b), m.ack())]),
    ):
        publish(server.url, FAST, {"n": 1})
        drain(conn, lambda: got)
    assert got == [{"n": 1}]
    stats = raw.info("commandstats")
    assert "cmdstat_blmove" not in stats and "cmdstat_evalsha" not in stats
    assert stats["cmdstat_brpop"]["calls"] >= 1
    [warning] = [r for r in caplog.records if "jobs.fetch.unsafe" in r.getMessage()]
    assert warning.levelno == logging.WARNING


def test_on_the_platforms_transport_a_refused_item_is_dead_lettered_and_not_kept(
    raw: redis.Redis, server: RedisServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs_platform import create_app
    from jobs_platform.brokers.redis.transport import Transport as PlatformTransport
    from jobs_platform.deadletter import envelope, rawpoison
    from jobs_platform.deadletter.record import DeadLetter

    app = create_app(
        "fetchtest", broker_url=server.url, database_url=f"sqlite:///{tmp_path}/jobs.sqlite3"
    )
    monkeypatch.setattr(rawpoison, "_worker", {"app": app, "hostname": "fetch@test"})
    publish(server.url, FAST, {"n": "bad"})
    item = loads(raw.rpop("fast"))
    item["body"] = "!!not base64!!"  # an envelope the script records, the screen refuses
    bad = dumps(item).encode()
    raw.rpush("fast", bad)
    publish(server.url, FAST, {"n": "good"})

    got: list[Any] = []
    with (
        Connection(server.url, transport=PlatformTransport) as conn,
        Consumer(conn.channel(), [FAST], callbacks=[lambda b, m: (got.append(b), m.ack())]),
    ):
        drain(conn, lambda: got)
    assert got == [{"n": "good"}]
    assert raw.hlen("unacked") == 0 and raw.zcard("unacked_index") == 0  # nothing comes back
    [letter] = [DeadLetter.from_json(e) for e in raw.lrange(app.jobs_settings.dlq_spool_key, 0, -1)]
    assert letter.error_type == envelope.BAD_BODY_ENCODING and letter.raw_body == bad.decode()


def test_the_platforms_channel_keeps_the_qos_that_skips_the_second_write() -> None:
    from jobs_platform.brokers.redis.fetch import KillSafeQoS
    from jobs_platform.brokers.redis.transport import Transport as PlatformTransport

    qos = PlatformTransport.Channel.QoS
    assert issubclass(qos, KillSafeQoS), (
        f"{qos.__qualname__} does not derive from jobs_platform.brokers.redis.fetch"
        ".KillSafeQoS: every message would be written to unacked twice (derive from both "
        "QoS classes)"
    )
