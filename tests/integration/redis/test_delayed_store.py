"""The delayed store on a real Redis: what the transport stores, what the release script
moves (exactly the due jobs, to the right priority list, byte for byte), cancel, listing,
and two releasers racing over 10,000 due jobs (each released exactly once)."""

from __future__ import annotations

import collections
import datetime as dt
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.transport import redis as kombu_redis

from jobs_platform.brokers.redis import options
from jobs_platform.brokers.redis.delayed import (
    DelayedJob,
    Keys,
    cancel,
    count,
    get,
    release_due,
    scan,
    store_args,
)
from jobs_platform.testing import RedisServer
from tests.support.delayed_app import make_app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
NOW_MS = 1_800_000_000_000


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    # Released jobs land on real queue lists ("fast"...): on a Redis of our own, no worker
    # of this test session ever sees them.
    with RedisServer() as srv:
        yield srv


@pytest.fixture()
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(server.url)
    c.flushdb()
    yield c
    c.close()


@pytest.fixture()
def app(server: RedisServer, client: redis.Redis) -> Any:
    made = make_app(broker_url=server.url)

    @made.task(name="delayed.it.echo", time_limit=2)
    def echo(text: str) -> str:
        return text

    made.echo = echo
    return made


def job(task_id: str, due: int, *, queue: str = "fast", priority: int = 0) -> DelayedJob:
    payload = json.dumps({"headers": {"id": task_id, "argsrepr": "('é 🚀',)"}}, ensure_ascii=False)
    suffix = f"\x06\x16{priority}" if priority else ""
    return DelayedJob(task_id, queue + suffix, payload, "t", queue, priority, due, "", 0)


def put(client: redis.Redis, keys: Keys, *jobs: DelayedJob) -> None:
    with client.pipeline(transaction=False) as pipe:
        for one in jobs:
            pipe.eval(*store_args(keys, one))
        pipe.execute()


def queued(client: redis.Redis, key: str) -> list[str]:
    return [item.decode() for item in client.lrange(key, 0, -1)]


# -- what the transport stores ---------------------------------------------------------------


def test_a_long_delay_is_stored_exactly_as_kombu_would_have_queued_it(
    app: Any, client: redis.Redis
) -> None:
    keys = options.keys_for(app)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        message = channel.prepare_message(
            '{"x": "Zoë 🚀"}',
            priority=6,
            content_type="application/json",
            content_encoding="utf-8",
            headers={"id": "m-1", "task": "delayed.it.echo", "eta": "2999-01-01T00:00:00+00:00"},
        )
        channel.basic_publish(message, exchange="", routing_key="fast")
    stored = get(client, keys, "m-1")
    assert stored is not None
    # basic_publish augmented the dict in place (delivery tag, routing): kombu's _put
    # would have LPUSHed dumps() of it, to the priority-6 list of "fast".
    assert stored.payload == kombu_redis.dumps(message)
    assert stored.list == "fast\x06\x166"
    assert (stored.task, stored.queue, stored.priority) == ("delayed.it.echo", "fast", 6)
    assert stored.due == 32_472_144_000_000
    assert client.llen("fast\x06\x166") == 0
    assert client.zscore(keys.due, "m-1") == stored.due


def test_apply_async_with_a_long_countdown_is_stored_and_a_short_one_queued(
    app: Any, client: redis.Redis
) -> None:
    keys = options.keys_for(app)
    long = app.echo.apply_async(("later é",), countdown=60, priority=3)
    short = app.echo.apply_async(("soon",), countdown=1)
    stored = get(client, keys, long.id)
    assert stored is not None
    message = stored.message
    assert message["headers"]["id"] == long.id
    assert message["headers"]["timelimit"] == [2, None]
    assert message["properties"]["priority"] == 3
    assert stored.list == "fast\x06\x163"
    assert 59_000 < stored.due - stored.stored <= 60_500
    assert get(client, keys, short.id) is None
    [queued_short] = queued(client, "fast")
    assert json.loads(queued_short)["headers"]["id"] == short.id
    # Released, it is on its priority list exactly as stored (argsrepr holds the é).
    assert release_due(client, keys, now_ms=stored.due).count == 1
    assert client.lrange("fast\x06\x163", 0, -1) == [stored.payload.encode()]


def test_a_batched_publish_stores_a_long_delay_and_queues_a_short_one(
    app: Any, client: redis.Redis
) -> None:
    keys = options.keys_for(app)
    soon = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)).isoformat()
    with app.connection_for_write() as conn:
        producer = conn.Producer()
        with producer.batch():
            for task_id, eta in (("b-long", "2999-01-01T00:00:00+00:00"), ("b-short", soon)):
                producer.publish(
                    "{}",
                    routing_key="fast",
                    content_type="application/json",
                    content_encoding="utf-8",
                    headers={"id": task_id, "task": "delayed.it.echo", "eta": eta},
                )
            assert get(client, keys, "b-long") is None  # buffered until the batch ends
    assert get(client, keys, "b-long") is not None
    [short] = queued(client, "fast")
    assert json.loads(short)["headers"]["id"] == "b-short"


# -- release ---------------------------------------------------------------------------------


def test_release_moves_exactly_the_due_jobs_to_their_lists_byte_for_byte(
    client: redis.Redis,
) -> None:
    keys = Keys("it:rel")
    due = [
        job("a", NOW_MS - 5000),
        job("b", NOW_MS, priority=9),
        job("c", NOW_MS - 1, queue="heavy", priority=3),
    ]
    later = [job("d", NOW_MS + 1), job("e", NOW_MS + 86_400_000)]
    put(client, keys, *due, *later)

    done = release_due(client, keys, now_ms=NOW_MS)

    assert done.count == 3
    assert sorted(done.lateness_ms) == [0, 1, 5000]
    assert queued(client, "fast") == [due[0].payload]
    assert queued(client, "fast\x06\x169") == [due[1].payload]
    assert queued(client, "heavy\x06\x163") == [due[2].payload]
    assert [j.id for j in scan(client, keys)] == ["d", "e"]
    assert client.hlen(keys.jobs) == 2
    # Nothing more is due: a second pass moves nothing.
    assert release_due(client, keys, now_ms=NOW_MS).count == 0


def test_release_uses_the_redis_clock_when_given_none(client: redis.Redis) -> None:
    keys = Keys("it:clock")
    server_ms = int(client.time()[0]) * 1000
    put(client, keys, job("past", server_ms - 10), job("future", server_ms + 60_000))
    assert release_due(client, keys).count == 1
    assert [j.id for j in scan(client, keys)] == ["future"]


def test_an_unreadable_entry_is_moved_aside_and_does_not_block_the_others(
    client: redis.Redis,
) -> None:
    keys = Keys("it:bad")
    put(client, keys, job("good", NOW_MS - 2))
    client.zadd(keys.due, {"garbage": NOW_MS - 3, "no-record": NOW_MS - 1})
    client.hset(keys.jobs, "garbage", "{not json")
    # Reading the store does not break on it either: it shows as task "?".
    assert [(j.id, j.task) for j in scan(client, keys)] == [("garbage", "?"), ("good", "t")]

    done = release_due(client, keys, now_ms=NOW_MS)

    assert (done.count, done.unreadable) == (1, 2)
    assert client.llen("fast") == 1
    assert client.hgetall(keys.unreadable) == {b"garbage": b"{not json"}
    assert count(client, keys) == 0 and client.hlen(keys.jobs) == 0


def test_release_is_bounded_by_its_limit_and_works_in_batches(client: redis.Redis) -> None:
    keys = Keys("it:batch")
    put(client, keys, *(job(f"j{i}", NOW_MS - i) for i in range(25)))
    assert release_due(client, keys, batch=4, limit=10, now_ms=NOW_MS).count == 10
    assert release_due(client, keys, batch=4, now_ms=NOW_MS).count == 15
    assert client.llen("fast") == 25


# -- cancel and listing ----------------------------------------------------------------------


def test_cancel_removes_a_job_once_and_it_is_never_released(client: redis.Redis) -> None:
    keys = Keys("it:cancel")
    put(client, keys, job("x", NOW_MS - 1), job("y", NOW_MS - 1))
    removed = cancel(client, keys, "x")
    assert removed is not None and removed.id == "x"
    assert cancel(client, keys, "x") is None
    assert cancel(client, keys, "never-stored") is None
    assert release_due(client, keys, now_ms=NOW_MS).count == 1
    [only] = queued(client, "fast")
    assert json.loads(only)["headers"]["id"] == "y"


def test_revoke_through_celery_removes_a_stored_job(app: Any, client: redis.Redis) -> None:
    result = app.echo.apply_async(("never",), countdown=3600)
    keys = options.keys_for(app)
    assert get(client, keys, result.id) is not None
    result.revoke()
    assert get(client, keys, result.id) is None
    assert count(client, keys) == 0


def test_scan_pages_by_due_time_through_many_jobs_due_at_the_same_moment(
    client: redis.Redis,
) -> None:
    keys = Keys("it:scan")
    put(client, keys, *(job(f"same{i:04d}", NOW_MS) for i in range(1200)))
    put(client, keys, job("early", NOW_MS - 1), job("late", NOW_MS + 1))
    ids = [j.id for j in scan(client, keys, chunk=100)]
    assert len(ids) == len(set(ids)) == 1202
    assert ids[0] == "early" and ids[-1] == "late"
    between = [j.id for j in scan(client, keys, due_after_ms=NOW_MS + 1, due_before_ms=NOW_MS + 2)]
    assert between == ["late"]


# -- two releasers ---------------------------------------------------------------------------

RACER = """
import sys, redis
from jobs_platform.brokers.redis.delayed import Keys, release_due
client = redis.Redis.from_url(sys.argv[1])
keys = Keys(sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
released = 0
while client.zcard(keys.due):
    released += release_due(client, keys, batch=int(sys.argv[3])).count
print(released, flush=True)
"""


def test_two_releasers_racing_over_10000_due_jobs_release_each_exactly_once(
    server: RedisServer, client: redis.Redis
) -> None:
    keys = Keys(f"it:race:{uuid.uuid4().hex[:6]}")
    server_ms = int(client.time()[0]) * 1000
    jobs = [
        job(f"r{i:05d}", server_ms - 1000 + i % 7, queue=("fast", "heavy")[i % 2], priority=i % 10)
        for i in range(10_000)
    ]
    put(client, keys, *jobs)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, server.url, keys.prefix, "50"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for _ in range(2)
    ]
    for racer in racers:
        assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
    for racer in racers:  # both start together
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    counts = [int(racer.communicate(timeout=120)[0].strip()) for racer in racers]

    ids: collections.Counter[str] = collections.Counter()
    lists = {j.list for j in jobs}
    for key in lists:
        for item in client.lrange(key, 0, -1):
            ids[json.loads(item)["headers"]["id"]] += 1
    assert sum(counts) == 10_000, counts
    assert all(c > 0 for c in counts), f"the releasers did not overlap: {counts}"
    assert len(ids) == 10_000 and set(ids.values()) == {1}
    assert count(client, keys) == 0 and client.hlen(keys.jobs) == 0
    # Each landed on its own priority list.
    for one in jobs[:50]:
        assert one.payload.encode() in client.lrange(one.list, 0, -1)
    print(f"releasers moved {counts} of 10,000 (each exactly once)", time.strftime("%X"))
