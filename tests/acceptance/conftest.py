"""Real worker processes against the real Redis broker (the session's own database)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.testing import WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def worker_env(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('db')}/jobs.sqlite3",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture(scope="session")
def test_app(worker_env: dict[str, str]) -> Any:
    import os

    os.environ.update({k: v for k, v in worker_env.items() if k != "PYTHONPATH"})
    from tests.support import worker_app

    return worker_app


def make_worker(env: dict[str, str], queues: list[str], tmp: Path, **kwargs: Any) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.worker_app", queues, env=env, cwd=str(ROOT), log_dir=str(tmp), **kwargs
    )


@pytest.fixture(scope="module")
def fast_worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, test_app: Any
) -> Iterator[WorkerProcess]:
    """One prefork worker consuming fast and thirdparty (not heavy)."""
    with make_worker(
        worker_env, ["fast", "thirdparty"], tmp_path_factory.mktemp("w"), concurrency=2
    ) as worker:
        yield worker


def runs(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in client.lrange(f"jptest:runs:{key}", 0, -1)]


def wait_state(result: Any, states: set[str], timeout_s: float = 30) -> str:
    return str(
        wait_for(
            lambda: result.state if result.state in states else None,
            timeout_s=timeout_s,
            message=lambda: f"{result.id} in {states} (now {result.state})",
        )
    )
