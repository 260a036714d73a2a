"""A ReliableTask retry ends its attempt without Celery's frame copies, and loses nothing that
Celery's own retry gave (real prefork worker, real Redis broker and result backend).

ReliableTask publishes the next attempt itself and ends the attempt with a Retry whose
exception info carries no frames (jobs_platform.cheap_retry). What readers of a retry
get is proven here: the RETRY state in the result backend with the error, the
``task_retry`` signal (metrics and beat read it), the ``task-retried`` event (Flower), and
the message options a retry must keep (a link callback runs once, after the success).
Queue, priority, history and backoff are proven in test_retries.py. The first test runs on
RabbitMQ too (``broker`` fixture): its event travels on the broker, its state on the
coordination Redis.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform import TransientError
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, Broker, runs, wait_state
from tests.acceptance.test_task_events import Monitor

pytestmark = pytest.mark.acceptance

NO_FRAMES = "no traceback is recorded for a retry"


@pytest.fixture(scope="module")
def retry_app(worker_env: dict[str, str]) -> Any:
    from tests.support import retry_app

    return retry_app


def start_worker(env: dict[str, str], tmp: pytest.TempPathFactory) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.retry_app",
        ["fast"],
        concurrency=2,
        env=env,
        hostname=f"retryend-{uuid.uuid4().hex[:6]}@test",
        cwd=str(ROOT),
        log_dir=str(tmp.mktemp("retryend")),
    )


@pytest.fixture(scope="module")
def retry_worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, retry_app: Any
) -> Iterator[WorkerProcess]:
    with start_worker(worker_env, tmp_path_factory) as worker:
        yield worker


@pytest.fixture(scope="module")
def broker_retry(
    broker: Broker, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, WorkerProcess]]:
    """``retry_app`` and its worker on the module's broker (on Redis: the module's own)."""
    if not broker.is_rabbitmq:
        yield request.getfixturevalue("retry_app"), request.getfixturevalue("retry_worker")
        return
    with start_worker(broker.env, tmp_path_factory) as worker:
        yield broker.load("tests.support.retry_app"), worker


def test_a_retried_attempt_is_stored_signalled_and_announced(
    broker_retry: tuple[Any, WorkerProcess], redis_client: redis.Redis
) -> None:
    retry_app, _ = broker_retry
    key = uuid.uuid4().hex
    with Monitor(retry_app.app) as monitor:
        result = retry_app.flaky.delay(key, 1)
        # The RETRY state holds for the whole wait before the next attempt (BACKOFF_S).
        assert wait_state(result, {"RETRY", "SUCCESS"}) == "RETRY"
        assert isinstance(result.result, TransientError)  # the task's own error
        assert f"partner unavailable for {key}" in result.traceback
        assert NO_FRAMES in result.traceback
        assert result.get(timeout=60) == key
        retried = wait_for(
            lambda: monitor.seen("task-retried", uuid=result.id),
            timeout_s=30,
            message=lambda: f"task-retried of {result.id} in {monitor.of_task(result.id)}",
        )
    print(f"task-retried event: {retried}")
    assert len(retried) == 1
    assert "TransientError" in retried[0]["exception"]
    assert NO_FRAMES in retried[0]["traceback"]
    signalled = [
        json.loads(x) for x in redis_client.lrange(f"jptest:retry-signal:{result.id}", 0, -1)
    ]
    assert [
        {k: s[k] for k in ("sender", "retries", "reason", "exc", "frames_copied")}
        for s in signalled
    ] == [
        {
            "sender": "retryend.flaky",
            "retries": 0,
            "reason": "PublishedRetry",
            "exc": "TransientError",
            "frames_copied": False,
        }
    ]
    assert NO_FRAMES in signalled[0]["traceback"]
    assert [(r["retries"], r["errors"], r["task_id"]) for r in runs(redis_client, key)] == [
        (0, 0, result.id),
        (1, 1, result.id),
    ]


def test_a_link_callback_survives_the_retry_and_runs_once_after_the_success(
    retry_app: Any, retry_worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    result = retry_app.flaky.apply_async((key, 1), link=retry_app.after.s(key))
    assert result.get(timeout=60) == key
    wait_for(
        lambda: redis_client.lrange(f"jptest:after:{key}", 0, -1),
        timeout_s=30,
        message=f"the link callback of {result.id}",
    )
    # The callback is the last run: once it has run, every run of the job is recorded.
    records = runs(redis_client, key)
    assert [(r["task_id"] == result.id, r["retries"]) for r in records] == [
        (True, 0),
        (True, 1),
        (False, 0),
    ]
    assert redis_client.lrange(f"jptest:after:{key}", 0, -1) == [key]
