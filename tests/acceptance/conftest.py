"""Real worker processes against the real Redis broker (the session's own database)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.testing import WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def worker_env(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The environment of worker processes, applied to this process too: apps created here
    (to dispatch and read results) must talk to the same isolated Redis database."""
    env = {
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('db')}/jobs.sqlite3",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    yield {**env, "PYTHONPATH": str(ROOT)}
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def test_app(worker_env: dict[str, str]) -> Any:
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


def copies_in_broker(client: redis.Redis, task_id: str) -> list[str]:
    """Where a message of ``task_id`` still exists: any queue list (priority sub-lists
    included) or the unacked hash (fetched, or held for a countdown, by some worker)."""
    found = []
    for key in client.scan_iter(count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "list" and not name.startswith("jptest:"):
            if any(task_id in str(item) for item in client.lrange(key, 0, -1)):
                found.append(name)
        elif (
            kind == "hash"
            and name == "unacked"
            and any(task_id in str(value) for value in client.hvals(key))
        ):
            found.append(name)
    return found
