"""Unique dispatch survives a pool process killed between taking the lock and publishing:
the lock it left lives only the publish's bound (JOBS_DISPATCH_TIMEOUT + 2 s), not
``unique_for``, so a re-dispatch soon after enqueues the job (real worker, real Redis)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis

from jobs_platform.idempotency.unique import LOCK_PREFIX, PENDING_SLACK_S
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, runs

pytestmark = pytest.mark.acceptance


def test_a_dispatcher_killed_between_lock_and_publish_blocks_re_dispatch_only_briefly(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    from tests.support import unique_app

    order, key = 7000 + uuid.uuid4().int % 1000, uuid.uuid4().hex
    lock = f"{LOCK_PREFIX}unique.charge:order_id={order}"
    bound_ms = (unique_app.DISPATCH_TIMEOUT_S + PENDING_SLACK_S) * 1000
    with WorkerProcess(
        "tests.support.unique_app", ["fast"], env=worker_env, cwd=str(ROOT), log_dir=str(tmp_path)
    ):
        dead = unique_app.dispatch_then_die.delay(order, key)
        holder = wait_for(lambda: redis_client.get(lock), timeout_s=20, message="the lock")
        left = redis_client.pttl(lock)
        # What the killed dispatch left: a lock for a job that was never published, living
        # the publish's bound, not unique_for (300 s).
        assert 0 < left <= bound_ms, left
        assert not runs(redis_client, key)
        early = unique_app.charge.delay(order, key)
        assert early.id == holder  # inside the bound: the dispatch still counts as pending
        wait_for(lambda: not redis_client.exists(lock), timeout_s=10, message="the lock to go")
        again = unique_app.charge.delay(order, key)
        assert again.id != holder
        [run] = wait_for(lambda: runs(redis_client, key), timeout_s=20, message="the charge")
        assert run["task_id"] == again.id
        # (That a published job's lock then lives unique_for, until the job ends and
        # releases it, is tests/integration/redis/test_unique_dispatch.py's.)
        assert dead.state in {"PENDING", "FAILURE"}
    print(f"\nkilled mid-dispatch: the lock it left had {left} ms to live (bound {bound_ms:g})")
    assert len(runs(redis_client, key)) == 1
