"""Delays longer than the visibility timeout, on real workers and a real Redis.

The apps (tests/support/delayed_app.py) use a 6 s visibility timeout, a 1 s margin and a
2 s hard time limit, so any wait of 3 s or more goes to the delayed store. "Runs exactly
once" is proved without waiting and hoping: the job succeeded and no copy of its message
is left anywhere on the broker (queues, unacknowledged, store), so it can never run again.

Redis-only, every test here: each is about the delayed store (RabbitMQ has none: its delays
wait in the broker's ``celery_delayed_N`` queues) or a Redis restart. RabbitMQ's delays are
proven in test_rabbitmq_broker.py (a 12 s countdown runs once on time, a sub-second one,
revoke of a delayed job no worker knows, retry waits never below the policy's bound) and
test_rabbitmq_operations.py (a 1 s wait then a 3 s one both come back).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.brokers.redis import delayed as store
from jobs_platform.brokers.redis import options
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, copies_in_broker, runs, wait_state
from tests.support.delayed_app import (
    BARE_QUEUE,
    VISIBILITY_TIMEOUT,
    declare,
    declare_bare,
    make_app,
    make_bare_app,
)

pytestmark = pytest.mark.acceptance

DELAY = 3 * VISIBILITY_TIMEOUT


@pytest.fixture()
def platform(worker_env: dict[str, str]) -> Any:
    app = make_app(broker_url=worker_env["JOBS_BROKER_URL"])
    return app, declare(app)


@contextlib.contextmanager
def worker(
    env: dict[str, str], tmp: Path, *, app: str = "tests.support.delayed_app", queue: str = "fast"
) -> Iterator[WorkerProcess]:
    with WorkerProcess(
        app,
        [queue],
        env=env,
        cwd=str(ROOT),
        log_dir=str(tmp),
        hostname=f"{queue}-{uuid.uuid4().hex[:6]}@delayed",
        concurrency=1,
    ) as proc:
        yield proc


def wait_gone(client: redis.Redis, keys: store.Keys, task_id: str, timeout_s: float) -> None:
    """Until no copy of ``task_id`` is left: not queued, not unacknowledged, not stored."""
    wait_for(
        lambda: not copies_in_broker(client, task_id) and store.get(client, keys, task_id) is None,
        timeout_s=timeout_s,
        message=lambda: f"{task_id} to leave the broker (in {copies_in_broker(client, task_id)})",
    )


def test_a_job_delayed_three_visibility_timeouts_runs_once_and_bare_celery_runs_it_more(
    platform: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    app, tasks = platform
    bare = declare_bare(make_bare_app(worker_env["JOBS_BROKER_URL"]))
    keys = options.keys_for(app)
    key = uuid.uuid4().hex
    with (
        worker(worker_env, tmp_path),
        worker(worker_env, tmp_path, app="tests.support.delayed_app:bare_app", queue=BARE_QUEUE),
    ):
        ours = tasks.record_run.apply_async((f"{key}-ours",), countdown=DELAY)
        theirs = bare.record_run.apply_async((f"{key}-bare",), countdown=DELAY)
        # Ours waits in the store, not in a worker's memory.
        stored = store.get(redis_client, keys, ours.id)
        assert stored is not None
        due = stored.due / 1000
        assert abs(due - (time.time() + DELAY)) < 5
        wait_for(
            lambda: len(runs(redis_client, f"{key}-bare")) >= 2,
            timeout_s=DELAY + 3 * VISIBILITY_TIMEOUT + 20,
            message="bare Celery to run its delayed job twice",
        )
        assert wait_state(ours, {"SUCCESS"}, timeout_s=30) == "SUCCESS"
        wait_gone(redis_client, keys, ours.id, timeout_s=30)
    ours_runs = runs(redis_client, f"{key}-ours")
    bare_runs = runs(redis_client, f"{key}-bare")
    print(
        f"\ndelay {DELAY:g} s, visibility timeout {VISIBILITY_TIMEOUT:g} s: "
        f"platform ran it {len(ours_runs)} time(s), bare Celery {len(bare_runs)} times"
    )
    assert len(ours_runs) == 1
    assert len(bare_runs) >= 2
    # Released on time: within a second of its ETA (release interval 0.25 s + the run).
    assert due - 0.01 <= ours_runs[0]["t"] < due + 1.5
    assert theirs.id != ours.id


def test_a_revoked_delayed_job_never_runs_even_on_a_worker_started_later(
    platform: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    app, tasks = platform
    keys = options.keys_for(app)
    key = uuid.uuid4().hex
    revoked = tasks.record_run.apply_async((f"{key}-revoked",), countdown=5)
    control = tasks.record_run.apply_async((f"{key}-control",), countdown=5)
    assert store.get(redis_client, keys, revoked.id) is not None
    # No worker runs yet, so none hears Celery's broadcast: only the store can stop it.
    revoked.revoke()
    assert store.get(redis_client, keys, revoked.id) is None
    with worker(worker_env, tmp_path):
        # Due at the same moment, dispatched after it: once the control job ran, the
        # revoked one would have been released too.
        assert wait_state(control, {"SUCCESS"}, timeout_s=60) == "SUCCESS"
    assert runs(redis_client, f"{key}-control")
    assert runs(redis_client, f"{key}-revoked") == []
    assert copies_in_broker(redis_client, revoked.id) == []


def test_a_retry_wait_longer_than_the_visibility_timeout_goes_through_the_store(
    platform: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    app, tasks = platform
    keys = options.keys_for(app)
    key = uuid.uuid4().hex
    wait_s = VISIBILITY_TIMEOUT + 2
    with worker(worker_env, tmp_path):
        result = tasks.fail_once.delay(key, wait_s)
        # The retry waits in the store while no worker holds any copy of the job.
        wait_for(
            lambda: (
                store.get(redis_client, keys, result.id) is not None
                and not copies_in_broker(redis_client, result.id)
            ),
            timeout_s=30,
            message="the retry to wait in the store only",
        )
        assert result.get(timeout=wait_s + 30) == "ran"
        wait_gone(redis_client, keys, result.id, timeout_s=30)
    first, second = runs(redis_client, key)  # exactly two runs
    assert second["retries"] == 1 and second["task_id"] == first["task_id"] == result.id
    assert wait_s - 0.1 <= second["t"] - first["t"] < wait_s + 2


def test_a_delayed_job_survives_a_redis_restart_with_aof_and_then_runs_once(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    with RedisServer(persistent=True) as server:
        env = {**worker_env, "JOBS_BROKER_URL": server.url}
        app = make_app(broker_url=server.url)
        tasks = declare(app)
        keys = options.keys_for(app)
        client = redis.Redis.from_url(server.url)
        key = uuid.uuid4().hex
        sent = tasks.record_run.apply_async((key,), countdown=8, ignore_result=True)
        assert store.get(client, keys, sent.id) is not None
        # Killed, not stopped: only what the append-only file already holds survives.
        assert server.process is not None
        server.process.kill()
        server.process.wait(10)
        server.process = None
        server.start()
        client = redis.Redis.from_url(server.url)
        assert store.get(client, keys, sent.id) is not None
        with worker(env, tmp_path):
            wait_for(lambda: runs(client, key), timeout_s=60, message="the job to run")
            wait_gone(client, keys, sent.id, timeout_s=30)
        assert len(runs(client, key)) == 1
        client.close()


def test_without_aof_a_redis_restart_loses_delayed_jobs_like_queued_ones() -> None:
    # What docs/delayed-jobs.md says: the store is exactly as durable as the queues.
    with RedisServer() as server:
        app = make_app(broker_url=server.url)
        tasks = declare(app)
        keys = options.keys_for(app)
        client = redis.Redis.from_url(server.url)
        delayed = tasks.record_run.apply_async(("x",), countdown=60, ignore_result=True)
        tasks.record_run.apply_async(("y",), ignore_result=True)
        assert store.count(client, keys) == 1 and client.llen("fast") == 1
        assert server.process is not None
        server.process.kill()
        server.process.wait(10)
        server.process = None
        server.start()
        client = redis.Redis.from_url(server.url)
        assert store.get(client, keys, delayed.id) is None and client.llen("fast") == 0
        client.close()
