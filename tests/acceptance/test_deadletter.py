"""Dead letters with real prefork workers, the real Redis broker and real PostgreSQL.

The terminal paths and a replay run on RabbitMQ too (``broker`` fixture, ``[rabbitmq]``: a
vhost of the module's own; markers, spool and results on the session's Redis database):
there the broker's own dead-lettering (a rejection) is drained from ``jobs.dead``. Raw
poison pushed into Redis lists stays Redis-only (RabbitMQ's: test_rabbitmq_deadletters.py).

Every terminal path lands exactly once with the right reason; poison messages land with
their raw body; a fixed job replays from the CLI with lineage, exactly once.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import gc
import importlib
import json
import os
import pickle
import subprocess
import sys
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import kombu
import pytest
import redis
from click.testing import CliRunner

from jobs_platform.cli.dlq import dlq
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, Broker

pytestmark = pytest.mark.acceptance

APP = "tests.support.dlq_app"


def dlq_env(redis_url: str, database_url: str, **extra: str) -> dict[str, str]:
    return {
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": database_url,
        "PYTHONPATH": str(ROOT),
        **extra,
    }


def import_dlq_app(env: dict[str, str]) -> Any:
    """The client side of ``tests.support.dlq_app`` (configured from ``env`` on first import)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from tests.support import dlq_app

        # Each module has its own broker and database: rebuild the app from this env.
        return importlib.reload(dlq_app)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class CliApp:
    """The test app as the CLI sees it, pointed at ``database_url``."""

    def __init__(self, app: Any, database_url: str) -> None:
        self._app = app
        self.jobs_settings = dataclasses.replace(app.jobs_settings, database_url=database_url)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app, name)


def cli(app: Any, database_url: str, *args: str) -> Any:
    return CliRunner().invoke(dlq, list(args), obj=SimpleNamespace(app=CliApp(app, database_url)))


def push_raw(
    client: redis.Redis, queue: str, body: bytes, content_type: str, headers: dict[str, Any]
) -> None:
    """Put a message straight into a Redis queue, the way kombu would have."""
    client.lpush(
        queue,
        json.dumps(
            {
                "body": base64.b64encode(body).decode(),
                "content-encoding": "binary",
                "content-type": content_type,
                "headers": headers,
                "properties": {
                    "body_encoding": "base64",
                    "delivery_tag": str(uuid.uuid4()),
                    "delivery_info": {"exchange": queue, "routing_key": queue},
                    "delivery_mode": 2,
                    "priority": 0,
                },
            }
        ),
    )


def rows_for(store: DeadLetterStore, task_id: str, timeout_s: float = 30) -> list[dict[str, Any]]:
    return wait_for(
        lambda: store.by_task_id(task_id),
        timeout_s=timeout_s,
        message=f"a dead letter for {task_id}",
    )


def alert_lines(worker: WorkerProcess, task_id: str) -> list[str]:
    return [
        line
        for line in worker.log().splitlines()
        if "jobs.dlq.dead_letter" in line and f"task_id={task_id}" in line
    ]


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    # A broker of our own: a stray worker left consuming "fast" on a shared DB (seen here)
    # would otherwise take these messages.
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def env(private_redis: RedisServer, module_pg_url: str) -> dict[str, str]:
    return dlq_env(private_redis.url, module_pg_url)


@pytest.fixture()
def coord(private_redis: RedisServer) -> Iterator[redis.Redis]:
    """The Redis where the jobs' markers and the dead-letter spool are (the broker here)."""
    client = redis.Redis.from_url(private_redis.url, decode_responses=True)
    yield client
    client.close()


def release_results(app: Any) -> None:
    """Let go of result subscriptions while this module's broker still answers.

    Each ``delay()`` subscribes to its result channel; an AsyncResult finalized after the
    private redis-server stopped would raise inside ``__del__``, failing a later test.
    """
    gc.collect()
    consumer = getattr(app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.subscribed_to.clear()
        consumer.stop()


@pytest.fixture(scope="module")
def app_module(env: dict[str, str]) -> Iterator[Any]:
    module = import_dlq_app(env)
    yield module
    release_results(module.app)


@pytest.fixture(scope="module")
def store(module_pg_url: str) -> DeadLetterStore:
    return DeadLetterStore(module_pg_url)


@pytest.fixture(scope="module")
def worker(
    env: dict[str, str],
    app_module: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[WorkerProcess]:
    with WorkerProcess(
        APP,
        ["fast", "heavy"],
        env=env,
        cwd=str(ROOT),
        concurrency=2,
        log_dir=str(tmp_path_factory.mktemp("dlqw")),
    ) as proc:
        yield proc


@dataclasses.dataclass
class Stack:
    """The module's dead-letter stack on one broker: the app module, its worker, the Redis
    client of markers and spool."""

    app_module: Any
    worker: WorkerProcess
    coord: redis.Redis
    is_rabbitmq: bool
    broker_url: str

    def push_raw(self, queue: str, body: bytes, content_type: str, headers: dict[str, Any]) -> None:
        """Put a message straight into ``queue``: a Redis list item, or a raw AMQP publish
        (the default exchange routes by queue name), as anyone who can write there could."""
        if not self.is_rabbitmq:
            raw = redis.Redis.from_url(self.broker_url)  # bytes in, bytes out
            try:
                push_raw(raw, queue, body, content_type, headers)
            finally:
                raw.close()
            return
        encoding = "binary" if content_type == "application/x-python-serialize" else "utf-8"
        with kombu.Connection(self.broker_url, transport_options={"confirm_publish": True}) as conn:
            kombu.Producer(conn.default_channel).publish(
                body,
                routing_key=queue,
                headers=headers,
                content_type=content_type,
                content_encoding=encoding,
            )


@pytest.fixture(scope="module")
def stack(
    broker: Broker,
    request: pytest.FixtureRequest,
    module_pg_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """On Redis the module's own ``app_module``, ``worker`` and private Redis; on RabbitMQ
    the same app and worker in the broker's vhost, with the same dead-letter table."""
    if not broker.is_rabbitmq:
        server = request.getfixturevalue("private_redis")
        client = redis.Redis.from_url(server.url, decode_responses=True)
        yield Stack(
            request.getfixturevalue("app_module"),
            request.getfixturevalue("worker"),
            client,
            False,
            server.url,
        )
        client.close()
        return
    env = {**broker.env, "JOBS_DATABASE_URL": module_pg_url}
    module = broker.load(APP, env)
    client = redis.Redis.from_url(broker.coordination_url, decode_responses=True)
    with WorkerProcess(
        APP,
        ["fast", "heavy"],
        env=env,
        cwd=str(ROOT),
        concurrency=2,
        log_dir=str(tmp_path_factory.mktemp("dlqw")),
    ) as proc:
        yield Stack(module, proc, client, True, broker.env["JOBS_BROKER_URL"])
    client.close()


def test_every_terminal_path_lands_once_with_its_reason(
    stack: Stack, store: DeadLetterStore
) -> None:
    app_module, worker, coord = stack.app_module, stack.worker, stack.coord
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    sent = {
        "exhausted": app_module.exhausted.delay("k1", password="hunter2").id,
        "permanent": app_module.permanent.delay("k2").id,
        "rejected": app_module.rejected.delay("k3").id,
        "time_limit": app_module.time_limit.delay("k4").id,
        "worker_lost": app_module.worker_lost.delay("k5").id,
        "expired": app_module.ok.apply_async(("k6",), expires=past).id,
    }
    # On RabbitMQ a rejection is stored twice over, once: by the worker's hook (naming the
    # worker) and by the drain of what the broker dead-lettered into jobs.dead (which
    # consumer rejected it is not in the message: no worker named); the first write wins.
    # An expiry in the past is a TTL of 0 there (Celery): the broker may expire the message
    # before any worker sees it (the drain's row) or a worker may revoke it (the hook's).
    by_broker = {"rejected", "expired"} if stack.is_rabbitmq else set()
    for reason, task_id in sent.items():
        [row] = rows_for(store, task_id)
        assert row["reason"] == reason, (reason, row["errors"])
        named = {None, worker.hostname} if reason in by_broker else {worker.hostname}
        assert row["status"] == "dead" and row["worker"] in named, (reason, row["worker"])
        if reason in by_broker:
            by = "drain" if row["worker"] is None else "hook"
            print(f"\n{reason} on RabbitMQ: stored by the {by}")

    [exhausted] = store.by_task_id(sent["exhausted"])
    # max_retries=3: four attempts, four errors, in order, with UTC times.
    assert exhausted["attempts"] == 4
    assert [e["attempt"] for e in exhausted["errors"]] == [1, 2, 3, 4]
    assert [e["type"] for e in exhausted["errors"]] == ["builtins.ConnectionError"] * 4
    times = [dt.datetime.fromisoformat(e["at"]) for e in exhausted["errors"]]
    assert times == sorted(times) and all(t.utcoffset() == dt.timedelta(0) for t in times)
    assert exhausted["args"] == ["k1"] and exhausted["kwargs"] == {"password": "***"}
    assert exhausted["redacted"] and exhausted["queue"] == "fast"
    assert "ConnectionError: partner refused connection #k1" in exhausted["traceback"]
    assert exhausted["enqueued_at"] <= exhausted["failed_at"]

    [lost] = store.by_task_id(sent["worker_lost"])
    assert lost["attempts"] == 2 and lost["queue"] == "heavy"  # max_retries=1, then the cap

    # Celery fires task_failure twice on a hard time limit: wait until both paths have run.
    tl = sent["time_limit"]
    wait_for(
        lambda: (
            f"Hard time limit (1.0s) exceeded for dlq.time_limit[{tl}]" in worker.log()
            and "Task handler raised error: TimeLimitExceeded" in worker.log()
        ),
        timeout_s=20,
        message="both hard-time-limit paths",
    )
    # The second report was spooled by the main process: wait until its drainer wrote it
    # (a no-op insert, no second alert) before counting rows and alert lines.
    spool_key = app_module.app.jobs_settings.dlq_spool_key
    wait_for(
        lambda: coord.llen(spool_key) == 0,
        timeout_s=30,
        message=lambda: f"the spool to drain (depth {coord.llen(spool_key)})",
    )
    assert len(store.by_task_id(tl)) == 1
    for task_id in sent.values():
        assert len(alert_lines(worker, task_id)) == 1, task_id


def test_poison_messages_land_with_their_raw_body(stack: Stack, store: DeadLetterStore) -> None:
    def headers(task: str) -> dict[str, Any]:
        task_id = str(uuid.uuid4())
        return {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "retries": 0}

    unknown, garbage, pickled = headers("no.such.task"), headers("dlq.ok"), headers("dlq.ok")
    pickle_body = pickle.dumps((("k",), {}, {}))
    stack.push_raw("fast", json.dumps([["x"], {"n": 1}, {}]).encode(), "application/json", unknown)
    stack.push_raw("fast", b"\x00\xff{not json", "application/json", garbage)
    stack.push_raw("fast", pickle_body, "application/x-python-serialize", pickled)

    [row] = rows_for(store, unknown["id"])
    assert (row["reason"], row["task_name"]) == ("poison", "no.such.task")
    assert row["error_type"] == "celery.exceptions.NotRegistered"
    assert row["raw_body"] == '[["x"], {"n": 1}, {}]' and row["raw_body_encoding"] == "utf-8"
    assert (row["args"], row["kwargs"]) == (["x"], {"n": 1})  # replayable once deployed

    [row] = rows_for(store, garbage["id"])
    assert row["reason"] == "poison" and row["error_type"] == "kombu.exceptions.DecodeError"
    assert base64.b64decode(row["raw_body"]) == b"\x00\xff{not json"

    [row] = rows_for(store, pickled["id"])
    assert row["error_type"] == "kombu.exceptions.ContentDisallowed"
    assert row["content_type"] == "application/x-python-serialize"
    assert base64.b64decode(row["raw_body"]) == pickle_body  # kept, never unpickled
    assert stack.worker.alive


def test_replay_of_a_fixed_job_links_lineage_and_enqueues_once(
    stack: Stack, store: DeadLetterStore, module_pg_url: str
) -> None:
    app_module, coord = stack.app_module, stack.coord
    # Quorum queues serve one priority level: RabbitMQ refuses any other at dispatch.
    priority = 0 if stack.is_rabbitmq else 3
    key = uuid.uuid4().hex
    first = app_module.fixable.apply_async((key,), {"amount": 5}, priority=priority)
    [row] = rows_for(store, first.id)
    assert (row["reason"], row["priority"], row["queue"]) == ("permanent", priority, "fast")

    # Refusals change nothing: no reason, and a dry run.
    refused = cli(app_module.app, module_pg_url, "discard", str(row["id"]))
    assert refused.exit_code == 2 and "--reason" in refused.output
    dry = cli(app_module.app, module_pg_url, "replay", str(row["id"]), "--reason", "x", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would_replay" in dry.output
    assert store.get(row["id"])["status"] == "dead"  # type: ignore[index]

    # Not fixed yet: the replay dies again, and the new row points back at the first.
    out = cli(
        app_module.app, module_pg_url, "replay", str(row["id"]), "--reason", "retry", "--json"
    )
    assert out.exit_code == 0, out.output
    replayed_id = json.loads(out.stdout)["task_id"]
    [second] = rows_for(store, replayed_id)
    assert second["replay_of"] == row["id"]
    assert second["attempts"] == 1 and len(second["errors"]) == 1  # a fresh budget
    assert (second["priority"], second["queue"], second["kwargs"]) == (
        priority,
        "fast",
        {"amount": 5},
    )
    parent = store.get(row["id"])
    assert parent is not None and parent["status"] == "replayed"
    assert parent["replayed_task_id"] == replayed_id and parent["resolution_reason"] == "retry"

    # Fix the cause, replay the second row: it succeeds.
    coord.set(f"jptest:fixed:{key}", 1)
    out = cli(
        app_module.app, module_pg_url, "replay", str(second["id"]), "--reason", "fixed", "--json"
    )
    final_id = json.loads(out.stdout)["task_id"]
    wait_for(
        lambda: coord.lrange(f"jptest:ran:{key}", 0, -1),
        timeout_s=30,
        message="the replayed job to run",
    )
    assert coord.lrange(f"jptest:ran:{key}", 0, -1) == ["5"]
    assert store.by_task_id(final_id) == []

    # Replaying the same row again enqueues nothing.
    again = cli(
        app_module.app, module_pg_url, "replay", str(second["id"]), "--reason", "x", "--json"
    )
    assert again.exit_code == 1  # a refusal
    assert json.loads(again.stdout) == {"id": second["id"], "outcome": "already_resolved"}
    assert store.get(second["id"])["replayed_task_id"] == final_id  # type: ignore[index]


def test_replay_of_a_poison_row_sends_a_new_message_not_the_old_one(
    app_module: Any,
    worker: WorkerProcess,
    store: DeadLetterStore,
    module_pg_url: str,
    private_redis: RedisServer,
) -> None:
    # A message for a task this worker does not know (deployed later, say) carries the
    # protocol headers of its first life: an id, retries, a past expiry, an eta.
    raw = redis.Redis.from_url(private_redis.url)
    old_id = str(uuid.uuid4())
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    headers = {
        "lang": "py",
        "task": "dlq.deployed_later",
        "id": old_id,
        "root_id": old_id,
        "parent_id": None,
        "group": None,
        "retries": 3,
        "expires": past,
        "eta": past,
        "timelimit": [None, None],
        "argsrepr": "('x',)",
        "kwargsrepr": "{}",
        "origin": "gen1@elsewhere",
        "tenant": "acme",  # the job's own header: kept
    }
    push_raw(raw, "fast", json.dumps([["x"], {}, {}]).encode(), "application/json", headers)
    raw.close()
    [row] = rows_for(store, old_id)
    assert row["reason"] == "poison" and row["headers"]["retries"] == 3  # shown as it came

    # Deployed where the replay runs but not yet to this worker: the replay is accepted.
    if "dlq.deployed_later" not in app_module.app.tasks:

        def deployed_later(*args: Any) -> None:
            return None

        app_module.app.task(name="dlq.deployed_later", shared=False)(deployed_later)
    out = cli(app_module.app, module_pg_url, "replay", str(row["id"]), "--reason", "x", "--json")
    assert out.exit_code == 0, out.output
    new_id = json.loads(out.stdout)["task_id"]
    assert new_id != old_id
    # Still unknown to the worker, the replay is recorded as poison again: its stored raw
    # headers are exactly what the replay published.
    [again] = rows_for(store, new_id)
    sent = again["headers"]
    assert sent["id"] == new_id and sent["root_id"] == new_id
    assert sent["retries"] == 0 and sent["expires"] is None and sent["eta"] is None
    assert sent["tenant"] == "acme" and sent["origin"] != "gen1@elsewhere"
    assert again["replay_of"] == row["id"]
    [parent] = store.by_task_id(old_id)  # the old id was not reused
    assert parent["status"] == "replayed" and parent["replayed_task_id"] == new_id


def test_a_permanent_error_is_logged_as_expected_without_a_traceback(
    app_module: Any, worker: WorkerProcess, store: DeadLetterStore
) -> None:
    """It was logged at ERROR as "raised unexpected", with the whole traceback."""
    result = app_module.permanent.delay(uuid.uuid4().hex)
    [row] = rows_for(store, result.id)
    assert row["reason"] == "permanent" and "Traceback" in (row["traceback"] or "")
    lines = [line for line in worker.log().splitlines() if f"[{result.id}]" in line]
    assert any("raised expected: PermanentError" in line for line in lines), lines
    assert not any("raised unexpected" in line for line in lines), lines
    assert not any(line.startswith("ERROR") or " ERROR/" in line for line in lines), lines


def test_replay_of_a_task_the_app_does_not_declare_is_refused(
    app_module: Any,
    worker: WorkerProcess,
    store: DeadLetterStore,
    module_pg_url: str,
    private_redis: RedisServer,
) -> None:
    """It used to be accepted, and the worker made another poison row of it."""
    raw = redis.Redis.from_url(private_redis.url)
    task_id = str(uuid.uuid4())
    headers = {"lang": "py", "task": "dlq.never_declared", "id": task_id, "root_id": task_id}
    push_raw(raw, "fast", json.dumps([["x"], {}, {}]).encode(), "application/json", headers)
    raw.close()
    [row] = rows_for(store, task_id)
    before = store.count()

    out = cli(app_module.app, module_pg_url, "replay", str(row["id"]), "--reason", "x", "--json")
    assert out.exit_code == 1, out.output
    refused = json.loads(out.stdout)
    assert refused["outcome"] == "refused"
    assert "'dlq.never_declared' is not registered in this app" in refused["why"]
    assert store.get(row["id"])["status"] == "dead"  # type: ignore[index]
    assert store.count() == before  # nothing was sent, so nothing died again


def test_typed_arguments_survive_a_failure_and_a_replay(
    app_module: Any,
    worker: WorkerProcess,
    store: DeadLetterStore,
    module_pg_url: str,
    coord: redis.Redis,
) -> None:
    """datetime, Decimal and UUID arrive as themselves on every attempt, are stored in the
    dead letter as sent (not a repr: the replay used to send a str), and arrive as
    themselves again from the replay. Nothing is set aside on the way."""
    from decimal import Decimal

    key = uuid.uuid4().hex
    when = dt.datetime(2026, 3, 1, 12, 30, 15, tzinfo=dt.UTC)
    amount, ref = Decimal("19.90"), uuid.UUID(int=42)
    first = app_module.typed.delay(key, when, amount=amount, ref=ref)
    [row] = rows_for(store, first.id)
    assert (row["reason"], row["attempts"]) == ("exhausted", 2)
    assert row["args"] == [key, {"__type__": "datetime", "__value__": when.isoformat()}]
    assert row["kwargs"] == {
        "amount": {"__type__": "decimal", "__value__": "19.90"},
        "ref": {"__type__": "uuid", "__value__": {"hex": ref.hex}},
    }
    expected = [["datetime", str(when)], ["Decimal", "19.90"], ["UUID", str(ref)]]
    seen = [json.loads(item) for item in coord.lrange(f"jptest:typed:{key}", 0, -1)]
    assert seen == [expected, expected]  # the first attempt and its retry
    assert coord.llen("jobs:dlq:spool:rejected") == 0

    coord.set(f"jptest:fixed:{key}", 1)
    out = cli(app_module.app, module_pg_url, "replay", str(row["id"]), "--reason", "x", "--json")
    assert out.exit_code == 0, out.output
    wait_for(
        lambda: coord.llen(f"jptest:typed:{key}") == 3,
        timeout_s=30,
        message="the replayed job to run",
    )
    assert json.loads(coord.lrange(f"jptest:typed:{key}", -1, -1)[0]) == expected
    assert store.by_task_id(json.loads(out.stdout)["task_id"]) == []  # it succeeded


def test_celery_cli_lists_dead_letters_as_json(
    app_module: Any,
    worker: WorkerProcess,
    store: DeadLetterStore,
    env: dict[str, str],
) -> None:
    task_id = app_module.permanent.delay("cli").id
    rows_for(store, task_id)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            APP,
            "dlq",
            "list",
            "--json",
            "--task",
            "dlq.permanent",
            "--failure-reason",
            "permanent",
        ],
        env={**os.environ, **env},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert rows[0]["task_id"] == task_id  # newest first
    for key in (
        "id",
        "task_id",
        "task_name",
        "queue",
        "args",
        "kwargs",
        "attempts",
        "errors",
        "reason",
        "status",
        "fingerprint",
    ):
        assert key in rows[0]
    assert set(rows[0]["errors"][0]) >= {"type", "message", "at"}


def test_demo_helper_shows_rows_alerts_and_a_replay(
    app_module: Any,
    worker: WorkerProcess,
    store: DeadLetterStore,
    coord: redis.Redis,
) -> None:
    from io import StringIO

    from rich.console import Console

    from tasks.demo_deadletters import show_and_replay

    key = uuid.uuid4().hex
    failed = [app_module.permanent.delay("demo").id, app_module.fixable.delay(key).id]
    out = StringIO()
    ok = show_and_replay(
        CliApp(app_module.app, store.url),
        failed,
        replay_task_id=failed[1],
        fix=lambda: coord.set(f"jptest:fixed:{key}", 1),
        log_paths=[worker.log_path],
        console=Console(file=out, width=200),
    )
    text = out.getvalue()
    assert ok, text
    assert "alert lines (2" in text and "replay ended SUCCESS" in text
    assert "second replay of the same row enqueued nothing" in text
