"""A worker SIGKILLed while it takes a message loses nothing (jobs_platform.brokers.redis.fetch).

Real workers (prefork -c 2) on a private redis-server with a 10 s visibility timeout:

- the window itself, made wide open: the worker's main process is stopped (SIGSTOP) while
  it waits on the broker, a job is sent, the server answers the stopped worker, and the
  whole worker is SIGKILLed. With kombu's ``BRPOP`` the job has left its queue and is in no
  ``unacked`` entry: gone (shown on the unpatched transport); with the kill-safe fetch the
  job never left its queue, and the next worker runs it;
- the soak: a whole worker SIGKILLed again and again while short jobs flow, restarted each
  time; at the end every job has run. Short form 200 jobs and 3 kills; ``JOBS_LONG_TESTS=1``
  runs 600 jobs and 12 kills.
"""

from __future__ import annotations

import os
import random
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform import create_app
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

TASK = "killsafe.note"
LONG = os.environ.get("JOBS_LONG_TESTS") == "1"
#: How long an idle worker blocks on the broker in the window tests: long enough that the
#: stopped worker is certainly still waiting when the job is sent.
LONG_BLOCK_S = 30


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as private:
        yield private


@pytest.fixture()
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture(scope="module")
def env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {
        "JOBS_BROKER_URL": server.url,
        "JOBS_DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('db')}/jobs.sqlite3",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture(scope="module")
def producer(env: dict[str, str]) -> Any:
    return create_app(
        "killsafe-producer",
        broker_url=env["JOBS_BROKER_URL"],
        database_url=env["JOBS_DATABASE_URL"],
    )


def worker(env: dict[str, str], tmp: Path, name: str, **extra_env: str) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.killsafe_app",
        ["fast"],
        env={**env, **extra_env},
        cwd=str(ROOT),
        log_dir=str(tmp),
        hostname=f"{name}-{uuid.uuid4().hex[:6]}@killsafe",
        concurrency=2,
    )


def ran(raw: redis.Redis, key: str) -> set[int]:
    return {int(n) for n in raw.smembers(f"jptest:ran:{key}")}


def copies(raw: redis.Redis, key: str) -> list[str]:
    """Where a message of job ``key`` is in the broker: queue lists or the unacked hash."""
    found = [
        f"list {name}" for name in raw.scan_iter("fast*") if key in str(raw.lrange(name, 0, -1))
    ]
    found += [f"unacked {tag}" for tag, entry in raw.hgetall("unacked").items() if key in entry]
    return found


def waiting_on_broker(raw: redis.Redis) -> str | None:
    """The blocking command a consumer has been waiting on for a short while, if any."""
    for entry in raw.client_list():
        blocked = "b" in entry["flags"] and entry["cmd"] in ("brpop", "blmove")
        if blocked and int(entry["idle"]) < LONG_BLOCK_S - 10:  # far from its timeout
            return str(entry["cmd"])
    return None


def hand_over_and_kill(raw: redis.Redis, producer: Any, proc: WorkerProcess, key: str) -> str:
    """Send a job to a worker stopped in its wait, let the server answer it, SIGKILL it."""
    command = wait_for(
        lambda: waiting_on_broker(raw), timeout_s=LONG_BLOCK_S + 10, message="a waiting worker"
    )
    proc.signal(signal.SIGSTOP)  # the main process: it can no longer read its socket
    try:
        assert waiting_on_broker(raw) == command
        producer.send_task(TASK, args=[key, 0], queue="fast")
        wait_for(
            lambda: waiting_on_broker(raw) is None,
            timeout_s=10,
            message="the server to answer the stopped worker",
        )
    finally:
        proc.kill()  # the whole process group, stopped or not
    return command


def test_a_worker_killed_while_the_server_hands_it_a_job_loses_nothing(
    raw: redis.Redis, producer: Any, env: dict[str, str], tmp_path: Path
) -> None:
    key = uuid.uuid4().hex
    proc = worker(env, tmp_path, "handed", JPTEST_BRPOP_TIMEOUT=str(LONG_BLOCK_S)).start()
    assert hand_over_and_kill(raw, producer, proc, key) == "blmove"

    assert copies(raw, key) == ["list fast"]  # never left its queue
    with worker(env, tmp_path, "next"):
        wait_for(lambda: ran(raw, key) == {0}, timeout_s=30, message="the job to run")


def test_without_the_kill_safe_fetch_the_same_kill_loses_the_job(
    raw: redis.Redis, producer: Any, env: dict[str, str], tmp_path: Path
) -> None:
    key = uuid.uuid4().hex
    proc = worker(
        env, tmp_path, "unsafe", JPTEST_BRPOP_TIMEOUT=str(LONG_BLOCK_S), JPTEST_UNSAFE_FETCH="1"
    ).start()
    assert hand_over_and_kill(raw, producer, proc, key) == "brpop"

    # Popped by BRPOP, recorded nowhere: no worker and no restore can ever run it.
    assert copies(raw, key) == []
    assert ran(raw, key) == set()


@pytest.mark.slow
def test_a_worker_killed_again_and_again_under_load_loses_no_job(
    raw: redis.Redis, producer: Any, env: dict[str, str], tmp_path: Path
) -> None:
    key, rng = uuid.uuid4().hex, random.Random(4354)
    jobs, rounds = (600, 12) if LONG else (200, 3)
    for n in range(jobs):
        producer.send_task(TASK, args=[key, n, 0.005], queue="fast")

    kills = 0
    for round_ in range(rounds):
        proc = worker(env, tmp_path, f"round{round_}").start()
        target = min(len(ran(raw, key)) + rng.randint(5, 40), jobs)
        try:
            wait_for(
                lambda target=target: len(ran(raw, key)) >= target,  # type: ignore[misc]
                timeout_s=60,
                message=lambda proc=proc, target=target, round_=round_: (  # type: ignore[misc]
                    f"{target} jobs run in round {round_} (ran {len(ran(raw, key))}); "
                    f"worker log tail:\n{proc.log()[-3000:]}"
                ),
            )
        finally:
            proc.kill()  # main process and pool children: SIGKILL, no goodbye
        kills += 1

    # Jobs the killed workers held come back after the visibility timeout (10 s).
    with worker(env, tmp_path, "last"):
        wait_for(
            lambda: len(ran(raw, key)) == jobs,
            timeout_s=60,
            message=lambda: (
                f"all {jobs} jobs (ran {len(ran(raw, key))}; "
                f"missing {sorted(set(range(jobs)) - ran(raw, key))[:20]})"
            ),
        )
    assert kills == rounds
    assert ran(raw, key) == set(range(jobs))
    assert int(raw.get(f"jptest:runs:{key}") or 0) >= jobs  # at least once each
