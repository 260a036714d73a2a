"""Dead letters and bad input on RabbitMQ: real worker processes, a vhost of each test's own,
a PostgreSQL dead-letter table of each test's own.

The broker dead-letters on its own (no Celery signal fires on that path) and each worker's
drain (jobs_platform.brokers.rabbitmq.deadletters) turns what reaches ``jobs.dead`` into one
row; bad input is rejected to the same exchange by the poison consumer
(jobs_platform.brokers.rabbitmq.poison) instead of being acknowledged and dropped.
"""

from __future__ import annotations

import base64
import json
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest
import redis

from jobs_platform import db
from jobs_platform.brokers.rabbitmq import deadletters
from jobs_platform.deadletter import envelope
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.testing import WorkerProcess, wait_for
from jobs_platform.testing.rabbitmq import rabbitmq_vhost
from tests.acceptance.conftest import ROOT
from tests.conftest import fresh_pg_database
from tests.support.rabbitmq_dlx_app import DELIVERY_LIMIT, EXCHANGE, QUEUE, make_app

pytestmark = pytest.mark.acceptance

APP = "tests.support.rabbitmq_dlx_app"


@pytest.fixture()
def pg_table() -> Iterator[str]:
    with fresh_pg_database() as url:
        db.upgrade(url)
        yield url


@pytest.fixture()
def setup(worker_env: dict[str, str], pg_table: str) -> Iterator[tuple[Any, dict[str, str]]]:
    """The app (to publish) and the workers' environment, on a vhost of the test's own."""
    with rabbitmq_vhost() as url:
        env = {**worker_env, "JOBS_TEST_AMQP_URL": url, "JOBS_DATABASE_URL": pg_table}
        app = make_app(url, broker_url=worker_env["JOBS_BROKER_URL"], database_url=pg_table)
        # The topology, declared before anything is published (as the broker's is).
        assert deadletters.declare_now(app)
        with app.connection_for_write() as conn:
            app.amqp.queues[QUEUE](conn.default_channel).declare()
        yield app, env


def worker(env: dict[str, str], tmp: Path) -> WorkerProcess:
    return WorkerProcess(APP, [QUEUE], env=env, cwd=str(ROOT), log_dir=str(tmp), concurrency=1)


def rows(url: str) -> list[dict[str, Any]]:
    return DeadLetterStore(url).listing(Filter(), page_size=100)


def runs(key: str, redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.llen(f"jptest:runs:{key}"))
    finally:
        client.close()


# -- (a) a job that kills its worker every time --------------------------------------------


def test_a_job_that_kills_its_whole_worker_each_time_ends_as_one_worker_lost_row(
    setup: tuple[Any, dict[str, str]], pg_table: str, tmp_path: Path
) -> None:
    app, env = setup
    key = uuid.uuid4().hex
    result = app.send_task("dlx.kill_worker", args=[key, {"order": 7}], kwargs={"note": "n"})
    starts = 0
    # Each delivery SIGKILLs the whole worker (the broker redelivers: no WorkerLostError, no
    # retry, no signal); a new worker is started after each, as a supervisor would. After
    # DELIVERY_LIMIT + 1 deliveries the broker dead-letters the message and the next
    # worker's drain stores it.
    while not rows(pg_table):
        assert starts <= DELIVERY_LIMIT + 2, f"no dead letter after {starts} workers"
        proc = worker(env, tmp_path).start(wait=False)
        starts += 1
        try:
            wait_for(
                lambda proc=proc: not proc.alive or rows(pg_table),
                timeout_s=60,
                message=lambda proc=proc: f"the job to kill its worker:\n{proc.log()[-3000:]}",
            )
        finally:
            proc.stop()
    assert runs(key, env["JOBS_BROKER_URL"]) == DELIVERY_LIMIT + 1
    assert starts == DELIVERY_LIMIT + 2  # three killed, one drained
    (row,) = rows(pg_table)
    assert (row["reason"], row["task_id"], row["task_name"]) == (
        "worker_lost",
        result.id,
        "dlx.kill_worker",
    )
    assert row["args"] == [key, {"order": 7}] and row["kwargs"] == {"note": "n"}
    assert (row["queue"], row["attempts"]) == (QUEUE, DELIVERY_LIMIT + 1)
    assert row["errors"][-1]["death"]["reason"] == "delivery_limit"


# -- (b) bad input, published raw ------------------------------------------------------------


def celery_headers(task: str) -> dict[str, Any]:
    task_id = str(uuid.uuid4())
    return {"lang": "py", "task": task, "id": task_id, "root_id": task_id, "retries": 0}


#: name -> (body, headers, content type, content encoding, the error type of its row)
BAD_INPUT: dict[str, tuple[bytes, dict[str, Any], str, str, str]] = {
    "not JSON": (b"this is not json {", {}, "application/json", "utf-8", "DecodeError"),
    "no task header": (
        json.dumps({"hello": "world"}).encode(),
        {},
        "application/json",
        "utf-8",
        deadletters.UNKNOWN_MESSAGE,
    ),
    "unknown task": (
        json.dumps([[1], {}, {}]).encode(),
        celery_headers("no.such.task"),
        "application/json",
        "utf-8",
        deadletters.NOT_REGISTERED,
    ),
    "body that does not decode": (
        b"\xff\xfe[1, {}",
        celery_headers("dlx.ok"),
        "application/json",
        "utf-8",
        "DecodeError",
    ),
    "pickle": (
        pickle.dumps(([1], {}, {})),
        celery_headers("dlx.ok"),
        "application/x-python-serialize",
        "binary",
        "ContentDisallowed",
    ),
    "arguments Celery cannot read": (
        json.dumps(["not a list", "not an object", None]).encode(),
        celery_headers("dlx.ok"),
        "application/json",
        "utf-8",
        envelope.UNREADABLE_MESSAGE,
    ),
}


def test_bad_input_published_raw_is_one_poison_row_each_and_the_worker_goes_on(
    setup: tuple[Any, dict[str, str]], pg_table: str, tmp_path: Path
) -> None:
    app, env = setup
    with worker(env, tmp_path) as proc:
        pid = proc.process.pid if proc.process else None
        with kombu.Connection(
            env["JOBS_TEST_AMQP_URL"], transport_options={"confirm_publish": True}
        ) as conn:
            producer = kombu.Producer(
                conn.default_channel, exchange=kombu.Exchange(EXCHANGE, type="topic")
            )
            for body, headers, content_type, encoding, _ in BAD_INPUT.values():
                producer.publish(
                    body,
                    routing_key=QUEUE,
                    headers=headers,
                    content_type=content_type,
                    content_encoding=encoding,
                )
        key = uuid.uuid4().hex
        good = app.send_task("dlx.ok", args=[key])
        client = redis.Redis.from_url(env["JOBS_BROKER_URL"])
        try:
            wait_for(
                lambda: client.lrange(f"jptest:done:{key}", 0, -1),
                timeout_s=30,
                message=lambda: f"the good job {good.id} to run:\n{proc.log()[-3000:]}",
            )
        finally:
            client.close()
        found = wait_for(
            lambda: r if len(r := rows(pg_table)) >= len(BAD_INPUT) else None,
            timeout_s=30,
            message=lambda: f"{len(BAD_INPUT)} poison rows (have {rows(pg_table)})",
        )
        assert proc.alive and proc.process is not None and proc.process.pid == pid
        assert "Unrecoverable error" not in proc.log()
    assert [r["reason"] for r in found] == ["poison"] * len(BAD_INPUT)
    by_body = {(r["raw_body"], r["raw_body_encoding"]): r for r in found}
    assert len(by_body) == len(BAD_INPUT), found
    for name, (body, headers, content_type, _, error_type) in BAD_INPUT.items():
        row = next(r for r in found if r["content_type"] == content_type and _same(r, body))
        assert row["error_type"].endswith(error_type), (name, row["error_type"])
        assert row["queue"] == QUEUE, name
        assert row["task_id"] == headers.get("id"), name
    assert len(rows(pg_table)) == len(BAD_INPUT)  # nothing else, no second row


def _same(row: dict[str, Any], body: bytes) -> bool:
    """Whether ``row`` holds ``body`` byte for byte (as text, or base64 when not UTF-8)."""
    if row["raw_body_encoding"] == "base64":
        return base64.b64decode(row["raw_body"]) == body
    return bool(row["raw_body"].encode("utf-8") == body)
