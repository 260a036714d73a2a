"""Queue isolation, serialisation safety and start-up refusal, with real worker processes."""

from __future__ import annotations

import datetime as dt
import pickle
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer

from jobs_platform import DispatchError
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, make_worker, runs

pytestmark = pytest.mark.acceptance


def refused_start(env: dict[str, str], tmp: Path, *, case: str = "none", **kwargs: Any) -> str:
    """Start a refusal-app worker that must refuse to start; return its log."""
    worker = WorkerProcess(
        "tests.support.refusal_app",
        ["fast"],
        cwd=str(ROOT),
        env={**env, "JOBS_TEST_REFUSAL": case},
        log_dir=str(tmp),
        **kwargs,
    )
    worker.start(wait=False)
    try:
        code = worker.wait_exit(60)
    finally:
        worker.stop()
    assert code != 0, worker.log()[-2000:]
    assert "ConfigError" in worker.log()
    return worker.log()


def test_heavy_task_is_never_consumed_by_a_fast_worker_and_retries_stay_on_heavy(
    test_app: Any,
    fast_worker: WorkerProcess,
    redis_client: redis.Redis,
    worker_env: dict[str, str],
    tmp_path: Path,
) -> None:
    heavy_key, canary = uuid.uuid4().hex, uuid.uuid4().hex
    heavy = test_app.heavy_flaky.delay(heavy_key, 1)
    # A fast task sent after it completes: the fast worker was consuming all along...
    assert test_app.record_run.delay(canary).get(timeout=30) == canary
    # ...and still the heavy task was not touched.
    assert runs(redis_client, heavy_key) == []
    assert heavy.state == "PENDING"
    assert redis_client.llen("heavy") == 1

    with make_worker(worker_env, ["heavy"], tmp_path, hostname="heavy1@test") as heavy_worker:
        assert heavy.get(timeout=30) == "ok"
        assert heavy_worker.alive
    records = runs(redis_client, heavy_key)
    assert len(records) == 2
    assert {(r["queue"], r["host"]) for r in records} == {("heavy", "heavy1@test")}


def test_pickle_message_is_not_executed_and_worker_keeps_working(
    test_app: Any, fast_worker: WorkerProcess, redis_client: redis.Redis, redis_url: str
) -> None:
    pickled_key, after_key = uuid.uuid4().hex, uuid.uuid4().hex
    task_id = str(uuid.uuid4())
    body = pickle.dumps(
        ((pickled_key,), {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None})
    )
    with Connection(redis_url) as conn:
        Producer(conn).publish(
            body,
            exchange=Exchange("fast", type="direct"),
            routing_key="fast",
            serializer=None,
            content_type="application/x-python-serialize",
            content_encoding="binary",
            headers={
                "lang": "py",
                "task": "tests.record",
                "id": task_id,
                "root_id": task_id,
                "retries": 0,
                "argsrepr": repr((pickled_key,)),
                "kwargsrepr": "{}",
            },
        )
    assert test_app.record_run.delay(after_key).get(timeout=30) == after_key
    assert runs(redis_client, pickled_key) == []
    assert fast_worker.alive
    wait_for(
        lambda: (
            "ContentDisallowed" in fast_worker.log() or "disallowed" in fast_worker.log().lower()
        ),
        timeout_s=10,
        message="the worker to log the refused pickle message",
    )


def test_non_json_argument_fails_at_dispatch(test_app: Any, redis_client: redis.Redis) -> None:
    before = redis_client.llen("fast")
    with pytest.raises(DispatchError, match="JSON"):
        test_app.record_run.delay({1, 2, 3})
    assert redis_client.llen("fast") == before


def test_explicit_unknown_queue_fails_at_dispatch(test_app: Any, redis_client: redis.Redis) -> None:
    before = redis_client.llen("fast")
    with pytest.raises(DispatchError, match=r"unknown queue 'fsat'.*fast, heavy, thirdparty"):
        test_app.record_run.apply_async(("x",), queue="fsat")
    assert redis_client.llen("fast") == before
    assert not redis_client.exists("fsat")


def test_wrong_arguments_fail_at_dispatch(test_app: Any) -> None:
    with pytest.raises(TypeError, match=r"record_run\(\) takes 2 positional arguments but 4"):
        test_app.record_run.delay("a", "b", "c")


def test_delay_beyond_max_delay_fails_at_dispatch(test_app: Any) -> None:
    # Up to JOBS_MAX_DELAY (30 days) a delay is stored; beyond it, refused before a publish.
    with pytest.raises(DispatchError, match="longer than JOBS_MAX_DELAY"):
        test_app.record_run.apply_async(("x",), countdown=31 * 86400)
    eta = dt.datetime.now(dt.UTC) + dt.timedelta(days=31)
    with pytest.raises(DispatchError, match="longer than JOBS_MAX_DELAY"):
        test_app.record_run.apply_async(("x",), eta=eta)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        (
            "lease",
            "worker_lease 28 s + unacked_restore_interval 5 s must be below "
            "visibility_timeout 30 s",
        ),
        ("retry_wait", "retry_backoff_max 25 s is longer than JOBS_MAX_DELAY (20 s)"),
        ("soft_limit", "soft_time_limit 12 s must be below time_limit 10 s"),
    ],
)
def test_worker_refuses_to_start_when_an_invariant_is_broken(
    case: str, expected: str, worker_env: dict[str, str], tmp_path: Path
) -> None:
    assert expected in refused_start(worker_env, tmp_path, case=case)


def test_refusal_app_starts_when_nothing_is_broken(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    worker = WorkerProcess(
        "tests.support.refusal_app",
        ["fast"],
        cwd=str(ROOT),
        env={**worker_env, "JOBS_TEST_REFUSAL": "none"},
        log_dir=str(tmp_path),
    )
    with worker:
        assert worker.alive


@pytest.mark.parametrize(
    ("pool", "extra", "expected"),
    [
        ("threads", [], "the 'threads' pool does not enforce hard time limits"),
        ("solo", [], "the 'solo' pool does not enforce hard time limits"),
        ("prefork", ["--prefetch-multiplier", "4"], "--prefetch-multiplier 4"),
    ],
)
def test_worker_refuses_a_pool_or_prefetch_that_voids_the_invariant(
    pool: str, extra: list[str], expected: str, worker_env: dict[str, str], tmp_path: Path
) -> None:
    assert expected in refused_start(worker_env, tmp_path, pool=pool, extra_args=extra)
