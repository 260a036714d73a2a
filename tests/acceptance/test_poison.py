"""Bad input in a queue never stops a worker and is never lost (real workers, real Redis).

Each bad item is pushed raw into a queue list with redis-py, as anyone who can write to the
broker could; then a good job is sent behind it. The good job must run, on the same worker
process, and the bad item must be a ``poison`` dead letter holding its exact bytes. Before
the transport's guard (jobs_platform.deadletter.rawpoison), a non-JSON item made the
worker exit ("Unrecoverable error") and a JSON object without the envelope vanished.

Redis-only: the items are Redis list entries (kombu's envelope, and what breaks it). On
RabbitMQ bad input arrives as raw AMQP publishes: test_deadletter.py's poison test runs
there too (``[rabbitmq]``, the platform's app) and test_rabbitmq_deadletters.py sends six
kinds of it.
"""

from __future__ import annotations

import base64
import gc
import importlib
import json
import os
import pickle
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from jobs_platform.deadletter import envelope
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.errors import DispatchError
from jobs_platform.testing import RedisServer, WorkerProcess, assert_dead_lettered, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

APP = "tests.support.poison_app"


# -- raw items, built the way kombu's Redis transport writes them ---------------------------


def task_headers(task: str = "poison.fast", **extra: Any) -> dict[str, Any]:
    task_id = str(uuid.uuid4())
    headers = {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "retries": 0}
    return {**headers, **extra}


def kombu_item(
    body: bytes,
    headers: dict[str, Any] | None = None,
    *,
    content_type: str = "application/json",
    body_encoding: str = "base64",
    raw_body: str | None = None,
) -> bytes:
    """An item as kombu would LPUSH it (``raw_body`` replaces the encoded body as is)."""
    encoded = base64.b64encode(body).decode() if body_encoding == "base64" else body.decode()
    return json.dumps(
        {
            "body": encoded if raw_body is None else raw_body,
            "content-encoding": "utf-8",
            "content-type": content_type,
            "headers": task_headers() if headers is None else headers,
            "properties": {
                "body_encoding": body_encoding,
                "delivery_tag": str(uuid.uuid4()),
                "delivery_info": {"exchange": "fast", "routing_key": "fast"},
                "delivery_mode": 2,
                "priority": 0,
            },
        }
    ).encode()


def call(args: Any, kwargs: Any = None) -> bytes:
    options = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return json.dumps([args, kwargs if kwargs is not None else {}, options]).encode()


GOOD_BODY = call(["k", 1])
TRUNCATED = kombu_item(GOOD_BODY)[:100]
OVERSIZE_BODY = call(["x" * 5000])  # over the app's 4096 bytes

#: name -> (item pushed, expected error type, bytes the dead letter must hold)
BAD_ITEMS: dict[str, tuple[bytes, str, bytes | None]] = {
    # Items kombu cannot read: recorded whole.
    "not_json": (b"not json", envelope.NOT_JSON, None),
    "truncated_json": (TRUNCATED, envelope.NOT_JSON, None),
    "binary_garbage": (b"\x00\xff\xfe\x80garbage\x00", envelope.NOT_JSON, None),
    "nul_in_text": (b"not\x00json", envelope.NOT_JSON, None),
    "json_without_envelope": (
        b'{"body": "x", "content-type": "application/json"}',
        envelope.NOT_AN_ENVELOPE,
        None,
    ),
    "json_list": (b"[1, 2, 3]", envelope.NOT_AN_ENVELOPE, None),
    "envelope_without_delivery_tag": (
        json.dumps({"body": "", "headers": {}, "properties": {"delivery_info": {}}}).encode(),
        envelope.NOT_AN_ENVELOPE,
        None,
    ),
    "body_not_base64": (
        kombu_item(GOOD_BODY, raw_body="%%% not base64 %%%"),
        envelope.BAD_BODY_ENCODING,
        None,
    ),
    "unknown_body_encoding": (
        kombu_item(GOOD_BODY).replace(b'"base64"', b'"rot13"'),
        envelope.BAD_BODY_ENCODING,
        None,
    ),
    # Envelopes Celery's consumer cannot read: recorded with their body.
    "task_without_id": (
        kombu_item(call(["no id"]), {k: v for k, v in task_headers().items() if k != "id"}),
        envelope.UNREADABLE_MESSAGE,
        call(["no id"]),
    ),
    "arguments_not_a_list": (
        kombu_item(call(5)),
        envelope.UNREADABLE_MESSAGE,
        call(5),
    ),
    "body_not_celery_shape": (
        kombu_item(b'{"a": 1}'),
        envelope.UNREADABLE_MESSAGE,
        b'{"a": 1}',
    ),
    "malformed_time_limit": (
        kombu_item(call(["bad limit"]), task_headers(timelimit="soon")),
        envelope.UNREADABLE_MESSAGE,
        call(["bad limit"]),
    ),
    "payload_over_the_limit": (
        kombu_item(OVERSIZE_BODY),
        envelope.PAYLOAD_TOO_LARGE,
        OVERSIZE_BODY,
    ),
}


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


@pytest.fixture(scope="module")
def env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    database = tmp_path_factory.mktemp("poisondb") / "jobs.sqlite3"
    return {
        "JOBS_BROKER_URL": server.url,
        "JOBS_DATABASE_URL": f"sqlite:///{database}",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture(scope="module")
def app_module(env: dict[str, str]) -> Iterator[Any]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from tests.support import poison_app

        module = importlib.reload(poison_app)  # built from this module's environment
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield module
    # Let go of result subscriptions while the private redis-server still answers.
    gc.collect()
    consumer = getattr(module.app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.subscribed_to.clear()
        consumer.stop()


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str], app_module: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with WorkerProcess(
        APP, ["fast"], env=env, cwd=str(ROOT), log_dir=str(tmp_path_factory.mktemp("pw"))
    ) as proc:
        yield proc


@pytest.fixture(scope="module")
def store(env: dict[str, str], worker: WorkerProcess) -> DeadLetterStore:
    return DeadLetterStore(env["JOBS_DATABASE_URL"])  # the worker migrated it at start


@pytest.fixture(scope="module")
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)  # bytes in, bytes out
    yield client
    client.close()


# -- helpers --------------------------------------------------------------------------------


def stored_bytes(row: dict[str, Any]) -> bytes:
    text = row["raw_body"] or ""
    if row["raw_body_encoding"] == "base64":
        return base64.b64decode(text)
    return str(text).encode("utf-8")


def poison_row(store: DeadLetterStore, holding: bytes) -> dict[str, Any]:
    """The one poison row whose raw body is exactly ``holding`` (waits for the drainer)."""

    def find() -> dict[str, Any] | None:
        rows = store.listing(Filter(reason="poison"), page_size=1000)
        matches = [r for r in rows if stored_bytes(r) == holding]
        assert len(matches) <= 1, matches
        return matches[0] if matches else None

    return wait_for(find, timeout_s=30, message=f"a poison row holding {holding[:60]!r}")


def next_job_runs(app_module: Any, raw: redis.Redis, queue: str = "fast") -> None:
    key = uuid.uuid4().hex
    result = app_module.BY_QUEUE[queue].delay(key)
    assert result.get(timeout=30) == 1
    assert raw.llen(f"jptest:runs:{key}") == 1


def same_process(worker: WorkerProcess) -> Callable[[], None]:
    assert worker.process is not None
    pid = worker.process.pid

    def check() -> None:
        assert worker.alive, worker.log()[-3000:]
        assert worker.process is not None and worker.process.pid == pid

    return check


# -- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(BAD_ITEMS))
def test_bad_item_is_dead_lettered_and_the_worker_consumes_the_next_job(
    name: str, app_module: Any, worker: WorkerProcess, store: DeadLetterStore, raw: redis.Redis
) -> None:
    item, error_type, holding = BAD_ITEMS[name]
    still_the_same_worker = same_process(worker)

    raw.lpush("fast", item)
    next_job_runs(app_module, raw)  # queued behind the bad item: it was read and passed

    still_the_same_worker()
    row = poison_row(store, item if holding is None else holding)
    assert (row["reason"], row["error_type"], row["queue"]) == ("poison", error_type, "fast")
    assert row["worker"] == worker.hostname
    assert row["status"] == "dead"
    assert raw.llen("fast") == 0


def test_refused_items_are_logged_once_each_with_a_stable_event(
    app_module: Any, worker: WorkerProcess, raw: redis.Redis
) -> None:
    marker = uuid.uuid4().hex.encode()
    raw.lpush("fast", b"not json " + marker)
    next_job_runs(app_module, raw)
    lines = wait_for(
        lambda: [line for line in worker.log().splitlines() if "jobs.dlq.poison:" in line][-1:],
        timeout_s=10,
        message="the jobs.dlq.poison line",
    )
    assert "jobs_platform.NotJSON" in lines[0] and "queue 'fast'" in lines[0]
    assert "Unrecoverable" not in worker.log()
    assert "Connection to broker lost" not in worker.log()


def test_wrong_argument_types_fail_the_job_once_as_a_permanent_dead_letter(
    app_module: Any, worker: WorkerProcess, raw: redis.Redis
) -> None:
    still_the_same_worker = same_process(worker)
    key = uuid.uuid4().hex
    result = app_module.fast.delay(key, "not a number")

    row = assert_dead_lettered(app_module.app, result.id, reason="permanent")
    assert row["error_type"] == "builtins.TypeError"
    assert row["args"] == [key, "not a number"]  # replayable once the caller is fixed
    next_job_runs(app_module, raw)
    still_the_same_worker()


def test_arguments_over_the_limit_are_refused_at_dispatch(
    app_module: Any, raw: redis.Redis
) -> None:
    before = raw.llen("fast")
    with pytest.raises(DispatchError, match=r"over JOBS_MAX_PAYLOAD_BYTES \(4096 bytes\)"):
        app_module.fast.delay("x" * 5000)
    assert raw.llen("fast") == before
    # At the limit itself, the job is sent (the limit counts the JSON of [args, kwargs]).
    filler = 4096 - len(json.dumps([[""], {}]))
    assert app_module.fast.delay("y" * filler).get(timeout=30) == 1


def test_unknown_tasks_and_pickle_are_dead_lettered_and_the_worker_keeps_consuming(
    app_module: Any, worker: WorkerProcess, store: DeadLetterStore, raw: redis.Redis
) -> None:
    still_the_same_worker = same_process(worker)
    unknown, pickled = task_headers("no.such.task"), task_headers("poison.fast")
    pickle_body = pickle.dumps((("k",), {}, {}))
    raw.lpush("fast", kombu_item(GOOD_BODY, unknown))
    raw.lpush(
        "fast", kombu_item(pickle_body, pickled, content_type="application/x-python-serialize")
    )
    next_job_runs(app_module, raw)

    row = assert_dead_lettered(app_module.app, unknown["id"], reason="poison")
    assert row["error_type"] == "celery.exceptions.NotRegistered"
    row = assert_dead_lettered(app_module.app, pickled["id"], reason="poison")
    assert row["error_type"] == "kombu.exceptions.ContentDisallowed"
    assert stored_bytes(row) == pickle_body  # kept, never unpickled
    still_the_same_worker()


def test_the_thirdparty_profile_worker_survives_bad_input_too(
    env: dict[str, str],
    app_module: Any,
    store: DeadLetterStore,
    raw: redis.Redis,
    tmp_path: Any,
) -> None:
    # Its own pool (whatever the profile says) and its own way of reading the broker.
    with WorkerProcess.for_profile(
        APP, "thirdparty", concurrency=2, env=env, cwd=str(ROOT), log_dir=str(tmp_path)
    ) as proc:
        still_the_same_worker = same_process(proc)
        item = b"{truncated " + uuid.uuid4().hex.encode()
        raw.lpush("thirdparty", item)
        next_job_runs(app_module, raw, "thirdparty")
        still_the_same_worker()
        row = poison_row(store, item)
        assert (row["error_type"], row["queue"]) == (envelope.NOT_JSON, "thirdparty")
