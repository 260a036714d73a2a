"""Batches end to end: real prefork workers on the real Redis and PostgreSQL.

- 2,000 no-op members, every tenth failing its first attempt, twenty failing for good,
  while one worker and then the other is SIGKILLed (and started again): the counts are
  exact (each member recorded once), on_complete and on_failure ran once, on_success not;
  the dead members replayed through the real replay after the "fix": on_success once;
- a batch cancelled mid-way: no member starts after the cancel (beyond those already past
  the check), the rest are counted cancelled, on_complete once;
- members that add members and then fail their first attempt: the re-run adds them once;
- members dead-lettered by the worker's main process (one SIGKILLs its pool process every
  run: worker_lost after max_retries; one overruns its hard time limit, which Celery reports
  twice): each counted dead once, linked to its letter, on_failure and on_complete once.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from jobs_platform import batch
from jobs_platform.batches import counting
from jobs_platform.batches.counting import callback_task_id
from jobs_platform.batches.model import batches, members
from jobs_platform.db import engine_for, upgrade
from jobs_platform.deadletter.replay import replay_rows
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.outbox.model import job_outbox
from jobs_platform.testing import WorkerProcess, wait_for

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
KEYS = (
    "batch:runs",
    "batch:starts",
    "batch:poison",
    "batch:callbacks",
    "batch:spawns",
    "batch:doomed",
)


@pytest.fixture(scope="module")
def env(worker_env: dict[str, str], pg_url: str) -> Iterator[dict[str, str]]:
    upgrade(pg_url)
    saved = os.environ.get("JOBS_DATABASE_URL")
    os.environ["JOBS_DATABASE_URL"] = pg_url
    yield {**worker_env, "JOBS_DATABASE_URL": pg_url}
    if saved is None:
        os.environ.pop("JOBS_DATABASE_URL", None)
    else:
        os.environ["JOBS_DATABASE_URL"] = saved


@pytest.fixture(scope="module")
def tasks(env: dict[str, str]) -> Any:
    module = importlib.import_module("tests.support.batch_app")
    if module.app.jobs_settings.database_url != env["JOBS_DATABASE_URL"]:
        module = importlib.reload(module)
    return module


@pytest.fixture()
def r(env: dict[str, str]) -> redis.Redis:
    client = redis.Redis.from_url(env["JOBS_BROKER_URL"], decode_responses=True)
    client.delete(*KEYS)
    return client


def worker(env: dict[str, str], tmp: Path, name: str, concurrency: int = 3) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.batch_app",
        ["fast"],
        env=env,
        cwd=str(ROOT),
        log_dir=str(tmp),
        concurrency=concurrency,
        hostname=f"{name}-{uuid.uuid4().hex[:6]}@batch",
    )


def counts(url: str, batch_id: str) -> Any:
    with engine_for(url).connect() as conn:
        return conn.execute(sa.select(batches).where(batches.c.id == batch_id)).one()


def outcomes(url: str, batch_id: str) -> dict[str, int]:
    with engine_for(url).connect() as conn:
        rows = conn.execute(
            sa.select(members.c.outcome, sa.func.count())
            .where(members.c.batch_id == batch_id)
            .group_by(members.c.outcome)
        ).all()
    return {str(o): int(n) for o, n in rows}


def callbacks(r: redis.Redis, batch_id: str) -> list[str]:
    return sorted(c.split(":")[0] for c in r.lrange("batch:callbacks", 0, -1) if batch_id in c)


def test_exact_counts_under_sigkills_and_on_success_after_the_replay(
    env: dict[str, str], tasks: Any, r: redis.Redis, tmp_path: Path
) -> None:
    url = env["JOBS_DATABASE_URL"]
    n, poison = 2000, [str(i) for i in range(7, 2000, 100)]  # 20 permanent failures
    r.sadd("batch:poison", *poison)
    cb = tasks.callback
    with worker(env, tmp_path, "a") as a, worker(env, tmp_path, "b") as b:
        made = batch(
            "kills",
            [tasks.member.s(i, transient_every=10) for i in range(n)],
            on_complete=cb.s("on_complete"),
            on_success=cb.s("on_success"),
            on_failure=cb.s("on_failure"),
        )
        for victim, below in ((a, 1600), (b, 900)):
            wait_for(lambda below=below: counts(url, made.id).pending < below, timeout_s=60)
            victim.signal(signal.SIGKILL, group=True)  # the worker and its pool, at once
            victim.wait_exit(timeout_s=10)
            victim.start()  # its unacknowledged members come back after the lease
        wait_for(lambda: counts(url, made.id).completed_at is not None, timeout_s=90)
        wait_for(lambda: len(callbacks(r, made.id)) >= 2, timeout_s=30)
        row = counts(url, made.id)
        assert (row.total, row.pending, row.succeeded, row.dead, row.cancelled) == (
            n,
            0,
            n - 20,
            20,
            0,
        )
        assert outcomes(url, made.id) == {"succeeded": n - 20, "dead": 20}
        # every member ran (some twice: a killed worker's), each counted once
        assert r.hlen("batch:runs") == n
        assert callbacks(r, made.id) == ["on_complete", "on_failure"]

        # The fix, then the real replay of the dead letters of this batch's members.
        r.delete("batch:poison")
        store = DeadLetterStore(url)
        ids = [i for chunk in store.ids(Filter(task="batch.member", status="dead")) for i in chunk]
        assert len(ids) == 20
        done = list(replay_rows(tasks.app, store, ids, reason="fixed", actor="test", rate=1000))
        assert all(o.done for o in done), done
        wait_for(lambda: "on_success" in callbacks(r, made.id), timeout_s=60)
        row = counts(url, made.id)
        assert (row.succeeded, row.dead, row.pending) == (n, 0, 0)
        # one more look after the relay's next passes: nothing fires twice
        wait_for(lambda: r.llen("batch:callbacks") >= 3, timeout_s=5)
        assert callbacks(r, made.id) == ["on_complete", "on_failure", "on_success"]


def test_cancel_mid_batch_runs_no_unstarted_member(
    env: dict[str, str], tasks: Any, r: redis.Redis, tmp_path: Path
) -> None:
    url = env["JOBS_DATABASE_URL"]
    n, concurrency = 300, 2
    with worker(env, tmp_path, "c", concurrency=concurrency):
        made = batch(
            "cancel",
            [tasks.slow.s(i) for i in range(n)],
            on_complete=tasks.callback.s("on_complete"),
            on_success=tasks.callback.s("on_success"),
        )
        wait_for(lambda: r.llen("batch:starts") >= 20, timeout_s=60)
        cancelled = subprocess.run(
            [sys.executable, "-m", "celery", "-A", "tests.support.batch_app", "batch", "cancel",
             made.id, "--reason", "enough"],
            env={**os.environ, **env}, cwd=ROOT, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert cancelled.returncode == 0, cancelled.stderr
        started_at_cancel = r.llen("batch:starts")
        wait_for(lambda: counts(url, made.id).completed_at is not None, timeout_s=60)
        wait_for(lambda: callbacks(r, made.id) == ["on_complete"], timeout_s=30)
        row = counts(url, made.id)
        started = r.llen("batch:starts")
        # Only members already past the check when the cancel committed may still start:
        # at most one per pool process.
        assert started <= started_at_cancel + concurrency
        assert row.succeeded == started and row.cancelled == n - started and row.dead == 0
        assert row.pending == 0 and row.cancel_reason == "enough"
        assert callbacks(r, made.id) == ["on_complete"]


def test_a_member_that_adds_members_counts_them_once(
    env: dict[str, str], tasks: Any, r: redis.Redis, tmp_path: Path
) -> None:
    url = env["JOBS_DATABASE_URL"]
    with worker(env, tmp_path, "d", concurrency=2):
        made = batch(
            "spawn",
            [tasks.spawner.s(i, 5) for i in range(3)],
            on_success=tasks.callback.s("on_success"),
            on_complete=tasks.callback.s("on_complete"),
        )
        wait_for(lambda: callbacks(r, made.id) == ["on_complete", "on_success"], timeout_s=60)
        row = counts(url, made.id)
        assert (row.total, row.succeeded, row.pending, row.dead) == (18, 18, 0, 0)
        assert all(int(v) == 2 for v in r.hvals("batch:spawns"))  # each spawner ran twice


def test_members_dead_lettered_by_the_main_process_count_dead_once(
    env: dict[str, str], tasks: Any, r: redis.Redis, tmp_path: Path
) -> None:
    url = env["JOBS_DATABASE_URL"]
    cb = tasks.callback
    with worker(env, tmp_path, "e", concurrency=2) as w:
        made = batch(
            "main process deaths",
            [tasks.member.s(1), tasks.killer.s(1), tasks.hung.s(1)],
            on_complete=cb.s("on_complete"),
            on_success=cb.s("on_success"),
            on_failure=cb.s("on_failure"),
        )
        wait_for(lambda: counts(url, made.id).completed_at is not None, timeout_s=60)
        wait_for(lambda: len(callbacks(r, made.id)) >= 2, timeout_s=30)
        # Celery reports a hard time limit twice (the second through the main process's
        # spool): wait until both reports were handled before counting.
        wait_for(
            lambda: "Task handler raised error: TimeLimitExceeded" in w.log(),
            timeout_s=20,
            message="the second hard-time-limit report",
        )
        spool_key = tasks.app.jobs_settings.dlq_spool_key
        wait_for(lambda: r.llen(spool_key) == 0, timeout_s=30, message="the spool to drain")
        row = counts(url, made.id)
        assert (row.total, row.pending, row.succeeded, row.dead, row.cancelled) == (3, 0, 1, 2, 0)
        assert outcomes(url, made.id) == {"succeeded": 1, "dead": 2}
        assert r.hgetall("batch:doomed") == {"killer1": "2", "hung1": "1"}  # max_retries=1
        shown = made.state()
        store = DeadLetterStore(url)
        reasons = {}
        for member_id, letter_id in shown.dead_letters.items():
            letter = store.get(letter_id)
            assert letter is not None and letter["task_id"] == member_id
            reasons[letter["task_name"]] = letter["reason"]
        assert reasons == {"batch.killer": "worker_lost", "batch.hung": "time_limit"}
        # Each callback is one outbox row under an id derived from (batch, callback): a
        # second enqueue could not add a row; on_success has none.
        with engine_for(url).connect() as conn:
            queued = conn.execute(
                sa.select(job_outbox.c.task_id).where(
                    job_outbox.c.task_id.in_(
                        [callback_task_id(made.id, c) for c in counting.CALLBACKS]
                    )
                )
            ).scalars()
            assert sorted(queued) == sorted(
                callback_task_id(made.id, c) for c in ("on_complete", "on_failure")
            )
        assert callbacks(r, made.id) == ["on_complete", "on_failure"]
