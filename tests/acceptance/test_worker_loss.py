"""Worker death: a killed worker loses nothing, and a job that kills its worker cannot loop.

The cap runs on RabbitMQ too (``broker`` fixture). The whole-worker SIGKILL stays on Redis
here: its RabbitMQ form (the broker hands a lost consumer's message back at once) is in
test_rabbitmq_broker.py, and the connection loss in test_rabbitmq_operations.py.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, Broker, runs, wait_state

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def redelivery(worker_env: dict[str, str]) -> Any:
    from tests.support import redelivery_app

    return redelivery_app


def worker(env: dict[str, str], tmp: Path, name: str) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.redelivery_app",
        ["fast"],
        env=env,
        cwd=str(ROOT),
        log_dir=str(tmp),
        hostname=f"{name}-{uuid.uuid4().hex[:6]}@loss",
        concurrency=1,
    )


@pytest.fixture(scope="module")
def broker_redelivery(broker: Broker) -> Any:
    return broker.load("tests.support.redelivery_app")


def test_job_that_kills_its_worker_is_retried_up_to_the_cap_then_fails(
    broker: Broker, broker_redelivery: Any, tmp_path: Path, redis_client: redis.Redis
) -> None:
    redelivery = broker_redelivery
    key = uuid.uuid4().hex
    with worker(broker.env, tmp_path, "poison") as proc:
        result = redelivery.kills_its_worker.delay(key, 99)
        assert wait_state(result, {"FAILURE"}, timeout_s=60) == "FAILURE"
        assert proc.alive  # only pool children died; the worker kept serving
    records = runs(redis_client, key)
    # max_retries=2: the first run and two retries, then it stops for good.
    assert len(records) == 3
    # Each lost attempt is in the history, and the retries stayed on their queue.
    assert [r["errors"] for r in records] == [0, 1, 2]
    assert {r["queue"] for r in records} == {"fast"}
    assert "WorkerLostError" in type(result.result).__name__ or "WorkerLost" in str(result.result)


def test_job_that_kills_its_worker_once_succeeds_on_retry(
    redelivery: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    with worker(worker_env, tmp_path, "poison1"):
        assert redelivery.kills_its_worker.delay(key, 1).get(timeout=60) == "survived"
    assert len(runs(redis_client, key)) == 2


def test_sigkilled_worker_loses_nothing_the_job_is_redelivered(
    redelivery: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    with worker(worker_env, tmp_path, "doomed") as first:
        result = redelivery.slow_once.delay(key, 4.0)
        wait_for(lambda: runs(redis_client, key), timeout_s=30, message="the first run to start")
        first.kill()  # the whole worker, mid-task, before it could acknowledge
    assert result.state != "SUCCESS"
    with worker(worker_env, tmp_path, "survivor") as second:
        # Back after the visibility timeout (8 s) plus one restore sweep (1 s).
        assert result.get(timeout=45) == "done"
    records = runs(redis_client, key)
    assert len(records) == 2
    assert records[1]["host"] == second.hostname


def test_warm_shutdown_on_deploy_finishes_the_running_job(
    redelivery: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    with worker(worker_env, tmp_path, "deploy") as proc:
        result = redelivery.slow_once.delay(key, 2.0)
        wait_for(lambda: runs(redis_client, key), timeout_s=30, message="the run to start")
        proc.signal(signal.SIGTERM)  # what `docker stop` / systemd send on a deploy
        assert proc.wait_exit(30) == 0
    assert result.get(timeout=5) == "done"
    assert len(runs(redis_client, key)) == 1
