"""The I/O profile (gevent) keeps the hard time limit and the visibility-timeout invariant.

Real ``thirdparty`` workers started as ``worker-profile thirdparty`` starts them (``-P
gevent``), on a private redis-server (the test app's visibility timeout is 6 s: it must
not restore another test's messages) and a SQLite dead-letter table of the module's own.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.cooperative.policy import EXIT_STATUS
from jobs_platform.testing import RedisServer, WorkerProcess, assert_dead_lettered
from tests.acceptance.conftest import ROOT, runs

pytestmark = pytest.mark.acceptance

APP = "tests.support.io_app"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with RedisServer() as server:
        db = tmp_path_factory.mktemp("io-db")
        yield {
            "JOBS_BROKER_URL": server.url,
            "JOBS_DATABASE_URL": f"sqlite:///{db}/jobs.sqlite3",
            "PYTHONPATH": str(ROOT),
        }


@pytest.fixture(scope="module")
def io(env: dict[str, str]) -> Iterator[Any]:
    """The test app as a producer, pointed at this module's Redis (the app reads its
    settings, and ``recording`` its client, from the environment)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    from tests.support import io_app, recording

    recording.client.cache_clear()
    module = importlib.reload(io_app)
    yield module
    module.app.close()
    recording.client.cache_clear()
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture()
def client(env: dict[str, str]) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(env["JOBS_BROKER_URL"], decode_responses=True)
    yield conn
    conn.close()


def thirdparty_worker(env: dict[str, str], tmp: Path, name: str) -> WorkerProcess:
    return WorkerProcess.for_profile(
        APP,
        "thirdparty",
        concurrency=10,
        hostname=f"{name}-{uuid.uuid4().hex[:6]}@io",
        env=env,
        cwd=ROOT,
        log_dir=str(tmp),
    )


def test_the_profile_is_gevent(env: dict[str, str], tmp_path: Path) -> None:
    proc = thirdparty_worker(env, tmp_path, "argv")
    argv = proc.argv()
    assert argv[argv.index("-P") + 1] == "gevent"


def test_a_hung_call_that_yields_is_stopped_at_the_hard_limit_and_dead_lettered(
    io: Any, env: dict[str, str], tmp_path: Path, client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    with thirdparty_worker(env, tmp_path, "hung") as proc:
        hung = io.hangs.delay(key)
        answered = io.waits.delay(f"{key}-quick", 0.2)
        row = assert_dead_lettered(env["JOBS_DATABASE_URL"], hung.id, reason="time_limit")
        # The other call ran beside the hung one, and the worker itself kept serving.
        assert answered.get(timeout=30) == "answered"
        assert proc.alive
    assert row["attempts"] == 1
    assert "TimeLimitExceeded" in row["errors"][-1]["type"]
    assert len(runs(client, key)) == 1


def test_code_that_never_yields_ends_the_worker_and_dies_as_a_lost_worker(
    io: Any, env: dict[str, str], tmp_path: Path, client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    result = io.spins.delay(key, 99)  # max_retries=1: two attempts, both never yield
    started: list[WorkerProcess] = []
    try:
        # Attempt 1 holds the loop: the watchdog ends the worker after hard limit + grace.
        first = thirdparty_worker(env, tmp_path, "first").start()
        started.append(first)
        assert first.wait_exit(60) == EXIT_STATUS
        assert "jobs.watchdog.worker_ended" in first.log()
        assert "never yields" in first.log()
        # Redelivered after the visibility timeout, counted as a lost worker: retried as
        # attempt 2, which holds the next worker the same way.
        second = thirdparty_worker(env, tmp_path, "second").start()
        started.append(second)
        assert second.wait_exit(60) == EXIT_STATUS
        assert "jobs.watchdog.lost_attempt" in second.log()
        # Redelivered again with its retries spent: a lost worker, dead-lettered.
        third = thirdparty_worker(env, tmp_path, "third").start()
        started.append(third)
        row = assert_dead_lettered(
            env["JOBS_DATABASE_URL"], result.id, reason="worker_lost", timeout_s=60
        )
        assert third.alive
    finally:
        for proc in started:
            proc.stop()
    records = runs(client, key)
    assert [r["retries"] for r in records] == [0, 1]
    assert [r["errors"] for r in records] == [0, 1]  # the lost attempt is in the history
    assert row["attempts"] == 2
    assert [e["type"] for e in row["errors"]] == ["billiard.exceptions.WorkerLostError"] * 2
    assert result.state == "FAILURE"
