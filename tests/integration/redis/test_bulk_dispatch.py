"""Bulk dispatch on a real Redis and real workers: the messages are the ones ``.delay()``
sends (headers, stamp, routing, priority, delays to the store, task-sent events), unique
dispatch holds, they run, and a broker that dies mid-bulk leaves an exact account."""

from __future__ import annotations

import base64
import gc
import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.brokers.redis import options as delayed_options
from jobs_platform.brokers.redis.delayed import count as stored_count
from jobs_platform.brokers.redis.delayed import get as stored
from jobs_platform.brokers.redis.publish import PipelinedSession
from jobs_platform.bulk import BulkDispatchError
from jobs_platform.bulk import messages as bulk_messages
from jobs_platform.bulk import publish as bulk_publish
from jobs_platform.errors import DispatchError
from jobs_platform.history import ENQUEUED_HEADER
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for
from tests.support.bulk_app import declare, make_app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
#: Fields each message has of its own; everything else must be identical.
OWN_HEADERS = {"id", "root_id", "argsrepr", "kwargsrepr", "eta", ENQUEUED_HEADER}
OWN_PROPERTIES = {"correlation_id", "delivery_tag"}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    # A Redis of our own: queue lists are read raw, and one test stops the server.
    with RedisServer(persistent=True) as srv:
        yield srv


@pytest.fixture()
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(server.url)
    c.flushdb()
    yield c
    c.close()


@pytest.fixture()
def new_app(server: RedisServer, client: redis.Redis, tmp_path: Path) -> Iterator[Any]:
    def make(**overrides: Any) -> Any:
        made = make_app(server.url, database_url=f"sqlite:///{tmp_path}/jobs.sqlite3", **overrides)
        made.t = declare(made)
        return made

    yield make
    # AsyncResults unsubscribe from the result store when collected: while it still runs.
    gc.collect()


@pytest.fixture()
def app(new_app: Any) -> Any:
    return new_app()


def raw(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    """The messages in list ``key``, oldest first (kombu LPUSHes, workers take from the right)."""
    return [json.loads(item) for item in reversed(client.lrange(key, 0, -1))]


def body(message: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(message["body"]))


def assert_alike(sent_by_bulk: dict[str, Any], sent_by_delay: dict[str, Any]) -> None:
    """Equal but for each message's own fields (ids, reprs, ETA, stamp, delivery tag)."""
    a, b = sent_by_bulk, sent_by_delay
    assert {k: v for k, v in a["headers"].items() if k not in OWN_HEADERS} == {
        k: v for k, v in b["headers"].items() if k not in OWN_HEADERS
    }
    assert a["headers"].keys() == b["headers"].keys()
    assert {k: v for k, v in a["properties"].items() if k not in OWN_PROPERTIES} == {
        k: v for k, v in b["properties"].items() if k not in OWN_PROPERTIES
    }
    assert {k: v for k, v in a.items() if k not in ("headers", "properties", "body")} == {
        k: v for k, v in b.items() if k not in ("headers", "properties", "body")
    }
    assert a["headers"]["id"] == a["properties"]["correlation_id"] == a["headers"]["root_id"]


def test_bulk_messages_are_the_ones_delay_sends_in_call_order(
    app: Any, client: redis.Redis
) -> None:
    single = app.t.record.delay("k", 0)
    results = app.t.record.delay_many([("k", n) for n in range(1, 1201)])  # 3 pipelines
    messages = raw(client, "fast")
    assert len(messages) == 1201
    assert [m["headers"]["id"] for m in messages] == [single.id] + [r.id for r in results]
    for n, message in enumerate(messages[1:], start=1):
        assert_alike(message, messages[0])
        assert body(message)[:2] == [["k", n], {}]
        assert body(message)[2] == body(messages[0])[2]
        assert message["headers"]["argsrepr"] == repr(("k", n))
        assert message["headers"][ENQUEUED_HEADER] >= messages[0]["headers"][ENQUEUED_HEADER]


def test_routing_priority_keywords_and_signatures_match_apply_async(
    app: Any, client: redis.Redis
) -> None:
    record = app.t.record
    single = record.apply_async(("k",), {"n": 1}, queue="heavy", priority=6)
    bulk = record.apply_async_many(
        [(("k",), {"n": 2}), (["k"], {"n": 3}), record.s("k", n=4).set(priority=3)],
        queue="heavy",
        priority=6,
    )
    at_6, at_3 = raw(client, "heavy\x06\x166"), raw(client, "heavy\x06\x163")
    assert [m["headers"]["id"] for m in at_6] == [single.id, bulk[0].id, bulk[1].id]
    assert [m["headers"]["id"] for m in at_3] == [bulk[2].id]
    for message in at_6[1:]:
        assert_alike(message, at_6[0])
    assert at_6[2]["headers"]["argsrepr"] == "['k']"  # the arguments as given, like Celery
    assert at_6[1]["headers"]["kwargsrepr"] == "{'n': 2}"
    assert at_3[0]["properties"]["priority"] == 3
    assert client.llen("fast") == 0


def test_delays_go_where_delay_sends_them_short_to_the_queue_long_to_the_store(
    app: Any, client: redis.Redis
) -> None:
    record = app.t.record
    keys = delayed_options.keys_for(app)
    single_short = record.apply_async(("k", 0), countdown=5)
    single_long = record.apply_async(("k", 0), countdown=60)
    bulk = record.apply_async_many(
        [
            (("k", 1), {}),
            record.s("k", 2).set(countdown=60),
            record.s("k", 3).set(countdown=0),
            (("k", 4), {}),
        ],
        countdown=5,
    )
    queued = raw(client, "fast")
    assert [m["headers"]["id"] for m in queued] == [
        single_short.id,
        bulk[0].id,
        bulk[2].id,
        bulk[3].id,
    ]
    assert queued[1]["headers"]["eta"] > queued[0]["headers"]["eta"]  # its own ETA
    assert_alike(queued[1], queued[0])
    assert queued[2]["headers"]["eta"] is None  # countdown=0: no delay, as in Celery
    assert stored_count(client, keys) == 2
    long_single, long_bulk = stored(client, keys, single_long.id), stored(client, keys, bulk[1].id)
    assert long_single is not None and long_bulk is not None
    assert (long_bulk.list, long_bulk.queue, long_bulk.task) == (
        long_single.list,
        long_single.queue,
        long_single.task,
    )
    assert_alike(long_bulk.message, long_single.message)


def test_unique_dispatch_holds_within_and_across_bulks(app: Any, client: redis.Redis) -> None:
    charge = app.t.charge
    first = charge.delay(1)
    results = charge.delay_many([(1,), (2,), (3,), (2,), {"invoice_id": 3, "amount": 5}])
    assert results[0].id == first.id  # already queued: its id, nothing sent
    assert results[3].id == results[1].id  # a duplicate within the bulk
    assert results[4].id == results[2].id
    messages = raw(client, "thirdparty")
    assert [m["headers"]["id"] for m in messages] == [first.id, results[1].id, results[2].id]
    assert_alike(messages[1], messages[0])
    # The locks are the single path's: a later .delay() of invoice 2 gets the bulk's job.
    assert charge.delay(2).id == results[1].id
    # An explicit task id always publishes (a known job being re-sent), as apply_async.
    again = charge.apply_async_many([charge.s(3).set(task_id="explicit-3")])
    assert again[0].id == "explicit-3"
    assert client.llen("thirdparty") == 4


def test_task_sent_events_reach_an_event_receiver(new_app: Any) -> None:
    app = new_app(task_events="on")
    assert app.conf.task_send_sent_event
    seen: dict[str, dict[str, Any]] = {}
    receivers: list[Any] = []

    def listen() -> None:
        with app.connection_for_read() as conn:
            receiver = app.events.Receiver(
                conn, handlers={"task-sent": lambda event: seen.setdefault(event["uuid"], event)}
            )
            receivers.append(receiver)
            receiver.capture(limit=None, timeout=60, wakeup=False)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    wait_for(lambda: receivers, timeout_s=10, message="the event receiver")
    # The receiver subscribes right after it is built: send until it has seen one.
    wait_for(
        lambda: app.t.record.delay("warm", 0).id in seen or None,
        timeout_s=30,
        interval_s=0.3,
        message="the receiver to see a task-sent event",
    )
    results = app.t.record.delay_many([("k", n) for n in range(250)])
    wait_for(
        lambda: all(r.id in seen for r in results),
        timeout_s=30,
        message=lambda: f"task-sent events ({len(seen)} seen)",
    )
    receivers[0].should_stop = True
    thread.join(10)
    event = seen[results[7].id]
    assert (event["name"], event["queue"], event["args"]) == ("bulk.record", "fast", "('k', 7)")
    assert event["root_id"] == results[7].id and event["eta"] is None
    assert event["hostname"] == seen[results[0].id]["hostname"]
    assert event["clock"] > seen[results[0].id]["clock"]  # each event its own Lamport tick


def test_bulk_jobs_run_on_a_worker_like_delay_jobs(
    app: Any, client: redis.Redis, server: RedisServer, tmp_path: Path
) -> None:
    env = {
        "JOBS_BROKER_URL": server.url,
        "JOBS_DATABASE_URL": f"sqlite:///{tmp_path}/jobs.sqlite3",
    }
    single = app.t.record.delay("run", -1)
    results = app.t.record.delay_many([("run", n) for n in range(300)])
    with WorkerProcess(
        "tests.support.bulk_app", ["fast"], cwd=str(ROOT), env=env, log_dir=str(tmp_path)
    ):
        wait_for(
            lambda: client.llen("bulk:runs:run") >= 301,
            timeout_s=180,
            message=lambda: f"301 runs ({client.llen('bulk:runs:run')} so far)",
        )
        assert results[-1].get(timeout=30) == 299  # results come back (subscribed on get)
        assert single.get(timeout=30) == -1
    runs = [json.loads(item) for item in client.lrange("bulk:runs:run", 0, -1)]
    assert sorted(r["n"] for r in runs) == list(range(-1, 300))  # each exactly once
    assert {r["id"] for r in runs} == {single.id, *(r.id for r in results)}
    assert {r["queue"] for r in runs} == {"fast"}
    assert all(r["stamp"] for r in runs)  # the enqueue stamp travels with each
    assert all(r["root_id"] == r["id"] for r in runs)


def waited_off_cpu() -> float:
    """Seconds this thread has spent neither on a CPU nor waiting for one (Linux
    /proc/self/schedstat: time on CPU, time runnable; elsewhere, wall time): sleeping and
    blocked in the network, which is what a dispatch timeout bounds."""
    try:
        with open("/proc/self/schedstat") as stat:
            on_cpu, runnable = (int(field) / 1e9 for field in stat.read().split()[:2])
    except OSError:
        on_cpu = runnable = 0.0
    return time.monotonic() - on_cpu - runnable


def test_broker_down_at_the_start_sends_nothing_within_the_dispatch_timeout(
    app: Any, server: RedisServer
) -> None:
    task = app.t.record
    timeout = app.jobs_settings.dispatch_timeout
    server.stop()
    try:
        with pytest.raises(DispatchError) as single:
            task.delay("k", 0)
        failures: list[BulkDispatchError] = []
        for dispatch_many in (
            lambda: task.delay_many([("k", n) for n in range(10)]),
            lambda: task.apply_async_many([(("k", n), {}) for n in range(10)], priority=3),
        ):
            started = waited_off_cpu()
            with pytest.raises(BulkDispatchError) as failed:
                dispatch_many()
            waited = waited_off_cpu() - started
            print(f"refused after {waited:.2f} s waiting (JOBS_DISPATCH_TIMEOUT {timeout:g} s)")
            # The bound is the setting, on the time the dispatch spent waiting (sleeping or
            # blocked on the socket): the time this process ran, or waited for one of the 2
            # shared cores, is the machine's load, not the broker's silence.
            assert waited < timeout, waited
            failures.append(failed.value)
    finally:
        server.start()
    for error in failures:
        assert error.enqueued == [] and error.uncertain == []
        assert error.unsent == list(range(10)) and error.results == [None] * 10
        # The words .delay() uses: which broker, the setting, nothing enqueued, the cause.
        assert str(error) == str(single.value), (str(error), str(single.value))
    assert "did not answer within" in str(single.value)
    assert "JOBS_DISPATCH_TIMEOUT" in str(single.value)
    assert "Connection refused" in str(single.value)


def test_broker_dying_mid_bulk_leaves_an_exact_account(
    app: Any, client: redis.Redis, server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk_publish, "CHUNK", 10)
    flushes: list[int] = []
    flush = PipelinedSession.flush

    def flush_then_die(sink: Any) -> None:
        if len(flushes) == 2:
            server.stop()  # the broker goes away before the third pipeline
        flushes.append(1)
        flush(sink)

    monkeypatch.setattr(PipelinedSession, "flush", flush_then_die)
    try:
        with pytest.raises(BulkDispatchError) as failed:
            app.t.record.delay_many([("k", n) for n in range(45)])
    finally:
        server.start()
    error = failed.value
    print(error)
    assert error.enqueued == list(range(20))
    assert error.uncertain == list(range(20, 30))  # the pipeline being written
    assert error.unsent == list(range(30, 45))
    assert all(error.results[i] is None for i in error.unsent)
    assert "after 20 were enqueued; 10 uncertain" in str(error)
    # The enqueued ones are there (the server keeps its data across the restart), once;
    # the third pipeline met a closed connection, so none of its "uncertain" went out.
    client = redis.Redis.from_url(server.url)
    queued = [m["headers"]["id"] for m in raw(client, "fast")]
    assert queued == [error.results[i].id for i in range(20)]
    client.close()


def test_a_failure_part_way_frees_the_unique_locks_of_the_jobs_not_sent(
    app: Any, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk_publish, "CHUNK", 10)
    publish = bulk_messages.Messages.publish

    def fail_at_15(messages: Any, call: Any, stamp: str) -> Any:
        if call.index == 15:
            raise RuntimeError("out of memory, say")
        return publish(messages, call, stamp)

    monkeypatch.setattr(bulk_messages.Messages, "publish", fail_at_15)
    charge = app.t.charge
    with pytest.raises(BulkDispatchError, match="after 10 were enqueued; 0 uncertain") as failed:
        charge.delay_many([(n,) for n in range(30)])
    assert failed.value.unsent == list(range(10, 30))  # the chunk being built was discarded
    monkeypatch.undo()
    assert client.llen("thirdparty") == 10
    assert charge.delay(3).id == failed.value.results[3].id  # sent: still holds its lock
    again = charge.delay_many([(n,) for n in failed.value.unsent])  # freed: sent now
    assert client.llen("thirdparty") == 30
    assert len({r.id for r in again}) == 20


def test_a_producer_dispatching_in_bulk_loads_no_sqlalchemy(server: RedisServer) -> None:
    script = textwrap.dedent(
        f"""
        import json, sys
        from jobs_platform import ReliableTask, create_app

        app = create_app("producer", broker_url={server.url!r})

        @app.task(base=ReliableTask, queue="fast", business_key=("order_id",), unique_for=30)
        def ship(order_id: int) -> None: ...

        assert len(ship.delay_many([(1,), (2,), (1,)])) == 3
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "sqlalchemy")))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
