"""Checkpoints on real workers: a long job resumes where it died, whatever killed it.

Each run pushes the rows it did to ``jptest:rows:<key>``; a row done twice is one the job
did after its last checkpoint and again after the restart: at most one checkpoint interval.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform import checkpoints
from jobs_platform.deadletter import replay as dlq_replay
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, runs

pytestmark = pytest.mark.acceptance

TOTAL = 200
INTERVAL = 10


@pytest.fixture(scope="module")
def ckpt(worker_env: dict[str, str]) -> Any:
    from tests.support import checkpoint_app

    return checkpoint_app


def worker(env: dict[str, str], tmp: Path, name: str) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.checkpoint_app",
        ["fast"],
        env=env,
        cwd=str(ROOT),
        log_dir=str(tmp),
        hostname=f"{name}-{uuid.uuid4().hex[:6]}@ckpt",
        concurrency=1,
    )


@pytest.fixture()
def store(worker_env: dict[str, str]) -> Iterator[DeadLetterStore]:
    yield DeadLetterStore(worker_env["JOBS_DATABASE_URL"])


def done(client: redis.Redis, key: str) -> collections.Counter[int]:
    return collections.Counter(int(r) for r in client.lrange(f"jptest:rows:{key}", 0, -1))


def starts(client: redis.Redis, key: str) -> list[int]:
    return [int(s) for s in client.lrange(f"jptest:starts:{key}", 0, -1)]


def assert_resumed(client: redis.Redis, key: str) -> None:
    counts = done(client, key)
    assert set(counts) == set(range(TOTAL))  # every row done
    twice = [row for row, n in counts.items() if n > 1]
    assert max(counts.values()) <= 2
    assert len(twice) <= INTERVAL, twice  # at most one checkpoint interval again
    assert starts(client, key)[0] == 0 and starts(client, key)[-1] > 0  # resumed, not restarted


def test_a_sigkilled_worker_s_job_resumes_from_its_checkpoint_on_the_next_worker(
    ckpt: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    with worker(worker_env, tmp_path, "doomed") as first:
        result = ckpt.rows.delay(key, TOTAL, INTERVAL, 0.02)
        wait_for(lambda: len(done(redis_client, key)) >= 75, timeout_s=60, message="75 rows")
        first.kill()  # the whole worker, mid-job
    stored = checkpoints.peek(ckpt.app, result.id)
    assert stored is not None and stored["row"] >= 70
    with worker(worker_env, tmp_path, "survivor"):
        assert result.get(timeout=60) == TOTAL  # back after the lease/visibility timeout
    assert_resumed(redis_client, key)
    assert starts(redis_client, key) == [0, stored["row"]]
    # Cleared on success.
    assert checkpoints.peek(ckpt.app, result.id) is None


def test_a_pool_child_sigkilled_mid_job_resumes_and_a_retry_too(
    ckpt: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    kill, retry = uuid.uuid4().hex, uuid.uuid4().hex
    redis_client.set(f"jptest:trap:{kill}", "kill_child")
    redis_client.set(f"jptest:trap:{retry}", "transient")
    with worker(worker_env, tmp_path, "child") as proc:
        killed = ckpt.rows.delay(kill, TOTAL, INTERVAL, 0.0, 137)
        retried = ckpt.rows.delay(retry, TOTAL, INTERVAL, 0.0, 64)
        assert killed.get(timeout=60) == TOTAL
        assert retried.get(timeout=60) == TOTAL
        assert proc.alive
    assert starts(redis_client, kill) == [0, 130]
    assert starts(redis_client, retry) == [0, 60]
    assert [r["retries"] for r in runs(redis_client, kill)] == [0, 1]
    for key in (kill, retry):
        assert_resumed(redis_client, key)
    assert checkpoints.peek(ckpt.app, killed.id) is None


def test_a_dead_job_shows_its_checkpoint_and_its_replay_resumes_there(
    ckpt: Any,
    worker_env: dict[str, str],
    tmp_path: Path,
    redis_client: redis.Redis,
    store: DeadLetterStore,
) -> None:
    key = uuid.uuid4().hex
    redis_client.set(f"jptest:trap:{key}", "permanent")
    with worker(worker_env, tmp_path, "dlq"):
        result = ckpt.rows.delay(key, TOTAL, INTERVAL, 0.0, 93)
        [row] = wait_for(lambda: store.by_task_id(result.id), timeout_s=60, message="dead")
        assert row["reason"] == "permanent"
        assert row["headers"][checkpoints.HEADER] == {"row": 90}  # the letter shows it
        redis_client.delete(f"jptest:trap:{key}")  # the poison row is fixed
        new_id = dlq_replay.replay(ckpt.app, store, row["id"], reason="fixed", actor="test")
        assert new_id is not None and new_id != result.id
        assert ckpt.app.AsyncResult(new_id).get(timeout=60) == TOTAL
    assert starts(redis_client, key) == [0, 90]  # the replay started at the checkpoint
    assert_resumed(redis_client, key)
    assert checkpoints.peek(ckpt.app, new_id) is None


def test_a_checkpoint_over_the_limit_is_a_permanent_error_naming_its_size(
    ckpt: Any, worker_env: dict[str, str], tmp_path: Path, store: DeadLetterStore
) -> None:
    with worker(worker_env, tmp_path, "big"):
        result = ckpt.too_big.delay(1000)
        [row] = wait_for(lambda: store.by_task_id(result.id), timeout_s=60, message="dead")
    assert row["reason"] == "permanent" and row["attempts"] == 1
    assert "CheckpointRefused" in row["error_type"]
    assert "over JOBS_CHECKPOINT_MAX_BYTES (256)" in row["error_message"]
