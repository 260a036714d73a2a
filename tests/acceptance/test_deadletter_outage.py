"""The database is down while jobs die: nothing is lost, and nothing is doubled.

Worker A runs with its database URL on a dead loopback port: every dead letter (task
failures and a poison message) waits in the durable spool on the broker. Worker B, with
the live PostgreSQL URL, drains the spool at start: the rows appear, one per job.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import RedisServer, WorkerProcess, free_port, wait_for
from tests.acceptance.conftest import ROOT
from tests.acceptance.test_deadletter import (
    APP,
    dlq_env,
    import_dlq_app,
    push_raw,
    release_results,
)

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def private_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_dead_letters_survive_a_database_outage(
    private_redis: RedisServer,
    module_pg_url: str,
    tmp_path: Any,
) -> None:
    spool_key = f"jptest:spool:{uuid.uuid4().hex}"
    dead_url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/gone"
    down_env = dlq_env(private_redis.url, dead_url, JOBS_DLQ_SPOOL_KEY=spool_key)
    app_module = import_dlq_app(down_env)
    broker = redis.Redis.from_url(private_redis.url)
    try:
        with WorkerProcess(
            APP, ["fast"], env=down_env, cwd=str(ROOT), concurrency=2, log_dir=str(tmp_path)
        ) as down:
            ids = [app_module.permanent.delay(f"outage-{n}").id for n in range(5)]
            poison_id = str(uuid.uuid4())
            push_raw(
                broker,
                "fast",
                b"[[], {}, {}]",
                "application/json",
                {"lang": "py", "task": "no.such.task", "id": poison_id},
            )
            wait_for(
                lambda: broker.llen(spool_key) == 6,
                timeout_s=30,
                message=lambda: f"6 spooled dead letters (have {broker.llen(spool_key)})",
            )
            # The spool is written first, then the database is tried and the failure
            # logged loudly.
            wait_for(
                lambda: down.log().count("jobs.dlq.write_failed") >= 5,
                timeout_s=30,
                message="a write_failed line per task failure (pool children)",
            )
            # The poison message was spooled by the main process; its drainer keeps trying.
            wait_for(
                lambda: "jobs.dlq.drain_failed: 6 dead letter(s) wait" in down.log(),
                timeout_s=30,
                message="the drainer to report the 6 waiting dead letters",
            )
            assert "jobs.dlq.dead_letter " not in down.log()  # nothing claimed as stored
        spooled = [json.loads(item)["task_id"] for item in broker.lrange(spool_key, 0, -1)]
        assert sorted(spooled) == sorted([*ids, poison_id])  # count before: 6

        up_env = dlq_env(private_redis.url, module_pg_url, JOBS_DLQ_SPOOL_KEY=spool_key)
        with WorkerProcess(
            APP, ["fast"], env=up_env, cwd=str(ROOT), concurrency=1, log_dir=str(tmp_path)
        ):
            store = DeadLetterStore(module_pg_url)
            wait_for(
                lambda: broker.llen(spool_key) == 0, timeout_s=30, message="the spool to drain"
            )
            rows = {task_id: store.by_task_id(task_id) for task_id in [*ids, poison_id]}
        assert {k: len(v) for k, v in rows.items()} == dict.fromkeys(rows, 1)  # count after: 6
        assert rows[poison_id][0]["reason"] == "poison"
        assert {rows[i][0]["reason"] for i in ids} == {"permanent"}
        assert store.count() == 6
    finally:
        release_results(app_module.app)
        broker.close()
