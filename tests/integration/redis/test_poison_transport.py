"""The poison guard in kombu's own read paths, on a real redis-server, without a worker.

Both ways kombu reads a queue are covered: ``BRPOP`` (consumers, through the event loop or
``drain_events``; here with a ``global_keyprefix``, whose client kombu subclasses too) and
``RPOP`` (``basic_get``). A refused item reads as an empty poll, the next message is
delivered, and the dead letter is in the durable spool with the item's exact bytes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue

from jobs_platform import create_app
from jobs_platform.brokers.redis.transport import Transport
from jobs_platform.deadletter import envelope, rawpoison
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.testing import RedisServer, wait_for

pytestmark = pytest.mark.integration

FAST = Queue("fast", Exchange("fast", type="direct"), routing_key="fast")


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


@pytest.fixture()
def app(server: RedisServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A jobs-platform app bound as this process's worker, with a 1 KiB payload limit."""
    app = create_app(
        "guardtest",
        broker_url=server.url,
        database_url=f"sqlite:///{tmp_path}/jobs.sqlite3",
        max_payload_bytes=1024,
    )
    monkeypatch.setattr(rawpoison, "_worker", {"app": app, "hostname": "guard@test"})
    return app


def connection(url: str, **options: Any) -> Connection:
    return Connection(url, transport=Transport, transport_options=options)


def drain_until_delivered(conn: Connection, got: list[Any]) -> None:
    def delivered() -> bool:
        with contextlib.suppress(TimeoutError):  # nothing this round: poll again
            conn.drain_events(timeout=0.5)
        return bool(got)

    wait_for(delivered, timeout_s=10, message="the good message")


def spooled(app: Any, raw: redis.Redis) -> list[DeadLetter]:
    return [DeadLetter.from_json(e) for e in raw.lrange(app.jobs_settings.dlq_spool_key, 0, -1)]


def raw_bytes(letter: DeadLetter) -> bytes:
    assert letter.raw_body is not None
    if letter.raw_body_encoding == "base64":
        return base64.b64decode(letter.raw_body)
    return letter.raw_body.encode()


def test_basic_get_skips_a_refused_item_and_returns_the_next_message(
    app: Any, raw: redis.Redis, server: RedisServer
) -> None:
    with connection(server.url) as conn:
        channel = conn.channel()
        FAST(channel).declare()
        raw.lpush("fast", b"not json")
        Producer(channel).publish({"ok": 1}, exchange=FAST.exchange, routing_key="fast")

        assert channel.basic_get("fast") is None  # the item was refused: an empty poll
        message = channel.basic_get("fast", no_ack=True)
        assert message is not None and json.loads(message.body) == {"ok": 1}

    [letter] = spooled(app, raw)
    assert (letter.reason, letter.error_type, letter.queue) == ("poison", envelope.NOT_JSON, "fast")
    assert raw_bytes(letter) == b"not json" and letter.worker == "guard@test"
    assert letter.args is None  # nothing a replay could send


def test_a_consumer_with_a_key_prefix_skips_refused_items_and_gets_the_next_message(
    app: Any, raw: redis.Redis, server: RedisServer
) -> None:
    item = b'{"body": "x", "content-type": "application/json"}'
    got: list[Any] = []
    with connection(server.url, global_keyprefix="pfx:") as conn:
        channel = conn.channel()
        FAST(channel).declare()
        raw.lpush("pfx:fast", item)
        Producer(channel).publish({"ok": 2}, exchange=FAST.exchange, routing_key="fast")
        with Consumer(channel, [FAST], callbacks=[lambda body, msg: got.append(body)]):
            drain_until_delivered(conn, got)
    assert got == [{"ok": 2}]
    [letter] = spooled(app, raw)
    assert letter.error_type == envelope.NOT_AN_ENVELOPE
    assert letter.queue == "fast"  # the prefix is kombu's business, not the queue's name
    assert raw_bytes(letter) == item


def test_a_message_celery_could_not_read_is_recorded_acknowledged_and_skipped(
    app: Any, raw: redis.Redis, server: RedisServer
) -> None:
    got: list[Any] = []
    with connection(server.url) as conn:
        channel = conn.channel()
        FAST(channel).declare()
        producer = Producer(channel)
        # A task message without its id, then one over the 1 KiB limit, then a good one.
        producer.publish([["a"], {}, {}], routing_key="fast", headers={"task": "t.x"})
        big_id = str(uuid.uuid4())
        producer.publish(
            [["x" * 2000], {}, {}], routing_key="fast", headers={"task": "t.x", "id": big_id}
        )
        producer.publish([["b"], {}, {}], routing_key="fast", headers={"task": "t.x", "id": "2"})
        with Consumer(channel, [FAST], callbacks=[lambda body, msg: (got.append(body), msg.ack())]):
            drain_until_delivered(conn, got)
    assert got == [[["b"], {}, {}]]
    no_id, too_big = spooled(app, raw)
    assert no_id.error_type == envelope.UNREADABLE_MESSAGE
    assert "header 'id'" in no_id.error_message and no_id.args == ["a"]
    assert (too_big.error_type, too_big.task_id) == (envelope.PAYLOAD_TOO_LARGE, big_id)
    assert "over JOBS_MAX_PAYLOAD_BYTES (1024 bytes)" in too_big.error_message
    assert raw.hlen("unacked") == 0  # both acknowledged: nothing comes back


def test_without_an_app_to_record_it_a_refused_item_is_logged_whole(
    raw: redis.Redis,
    server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(rawpoison, "_worker", {})
    monkeypatch.setattr(
        rawpoison,
        "current_app",
        SimpleNamespace(_get_current_object=lambda: SimpleNamespace()),  # a plain Celery app
    )
    with caplog.at_level(logging.ERROR, "jobs_platform.deadletter"), connection(server.url) as conn:
        raw.lpush("fast", b"\xffnot json")
        assert conn.channel().basic_get("fast") is None
    [lost] = [r for r in caplog.records if "jobs.dlq.lost" in r.getMessage()]
    assert lost.levelno == logging.CRITICAL
    assert base64.b64encode(b"\xffnot json").decode() in lost.getMessage()
    assert any("jobs.dlq.poison" in r.getMessage() for r in caplog.records)
