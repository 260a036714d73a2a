"""No job is both dead-lettered and succeeded: a SIGTERM that lands inside the dead-letter
write ends the pool process once the letter is stored; Celery then retries the job as a lost
worker, and that delivery is acknowledged without running (its dead mark; real worker, real
Redis and database)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, runs

pytestmark = pytest.mark.acceptance


def test_a_job_whose_dead_letter_write_was_cut_by_sigterm_never_succeeds_too(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    from tests.support import both_app

    key = uuid.uuid4().hex
    store = DeadLetterStore(worker_env["JOBS_DATABASE_URL"])
    with WorkerProcess(
        "tests.support.both_app", ["fast"], env=worker_env, cwd=str(ROOT), log_dir=str(tmp_path)
    ) as worker:
        result = both_app.fails_then_works.delay(key)
        [row] = wait_for(
            lambda: store.by_task_id(result.id), timeout_s=30, message="the dead letter"
        )
        # Celery retried it (the pool process died after the write): that delivery is seen
        # and acknowledged without running.
        wait_for(
            lambda: "jobs.dlq.already_dead" in worker.log(),
            timeout_s=30,
            message="the retried delivery to be refused",
        )
        assert worker.alive
    assert row["reason"] == "permanent"
    assert len(runs(redis_client, key)) == 1  # the retry never ran
    assert result.state != "SUCCESS"
    assert len(store.by_task_id(result.id)) == 1
