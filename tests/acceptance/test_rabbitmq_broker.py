"""The RabbitMQ broker with real worker processes, each test module in a vhost of its own.

Coordination (and the result backend) is the session's own Redis database; dead letters go
to the module's own PostgreSQL database. Times are compared on what the platform stamps
(a failure's ``at`` in the attempt history, a message's ETA) against the worker's clock at
the next start: both on this machine, so the load cannot move one without the other.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kombu
import pytest

from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import WorkerProcess, wait_for
from jobs_platform.testing.letters import assert_dead_lettered
from jobs_platform.testing.rabbitmq import available, list_queues, rabbitmq_vhost
from tests.support import rabbitmq_app

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not available(), reason="RabbitMQ does not answer")


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """``env`` applied to this process too (apps made here dispatch and read results)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def rmq_env(redis_url: str, module_pg_url: str) -> Iterator[dict[str, str]]:
    with rabbitmq_vhost() as url:
        env = {
            "JOBS_BROKER_URL": url,
            "JOBS_COORDINATION_URL": redis_url,
            "JOBS_DATABASE_URL": module_pg_url,
        }
        with environment(env):
            yield {**env, "PYTHONPATH": str(ROOT)}


def worker(env: dict[str, str], tmp: Path, queues: tuple[str, ...] = ("fast",)) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.rabbitmq_app", list(queues), env=env, cwd=str(ROOT), log_dir=str(tmp)
    )


@pytest.fixture(scope="module")
def fast_worker(
    rmq_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with worker(rmq_env, tmp_path_factory.mktemp("w")) as proc:
        yield proc


@pytest.fixture(scope="module")
def tasks(rmq_env: dict[str, str]) -> Any:
    app = rabbitmq_app.make_app()
    return rabbitmq_app.declare(app)


def runs(env: dict[str, str], key: str) -> list[dict[str, Any]]:
    return rabbitmq_app.runs(env["JOBS_COORDINATION_URL"], key)


def vhost_of(env: dict[str, str]) -> str:
    return env["JOBS_BROKER_URL"].rsplit("/", 1)[1]


def stamp(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


def test_every_queue_is_a_quorum_queue_dead_lettering_into_jobs_dead(
    rmq_env: dict[str, str], fast_worker: WorkerProcess
) -> None:
    rows = {r["name"]: r for r in list_queues(vhost_of(rmq_env), "name", "type", "arguments")}
    for queue in ("fast", "heavy", "thirdparty"):  # heavy, thirdparty: not consumed here
        assert rows[queue]["type"] == "quorum", rows[queue]
        for argument in (
            '{"x-dead-letter-exchange","jobs.dead"}',
            '{"x-dead-letter-strategy","at-least-once"}',
            '{"x-overflow","reject-publish"}',
            '{"x-delivery-limit",10}',
        ):
            assert argument in rows[queue]["arguments"], rows[queue]
    assert rows["jobs.dead"]["type"] == "quorum"
    assert "dead-letter" not in rows["jobs.dead"]["arguments"]
    assert {f"celery_delayed_{n}" for n in range(28)} <= set(rows)


def test_a_failing_job_waits_at_least_its_backoff_then_is_dead_lettered_once(
    rmq_env: dict[str, str], fast_worker: WorkerProcess, tasks: Any
) -> None:
    result = tasks.always_fails.delay("fails")
    row = assert_dead_lettered(rmq_env["JOBS_DATABASE_URL"], result.id, timeout_s=60)
    assert row["reason"] == "exhausted"
    assert row["queue"] == "fast"  # not the delay-prefixed routing key
    seen = runs(rmq_env, "fails")
    assert [r["retries"] for r in seen] == [0, 1, 2]
    # Equal jitter: retry n waits in [w/2, w], w = 1.5 * 2**(n-1) capped at 3 s; the broker
    # delays whole seconds, rounded up, so no wait is below w/2.
    for run, lower in zip(seen[1:], (0.75, 1.5), strict=True):
        waited = run["t"] - stamp(run["failed_at"])
        assert waited >= lower, (waited, lower, seen)
    rows = DeadLetterStore(rmq_env["JOBS_DATABASE_URL"]).by_task_id(result.id)
    assert len(rows) == 1, rows


def test_a_12_s_countdown_runs_once_on_time(
    rmq_env: dict[str, str], fast_worker: WorkerProcess, tasks: Any
) -> None:
    sent = time.time()
    result = tasks.record_run.apply_async(("twelve",), countdown=12)
    assert result.get(timeout=40) == "ran"
    (run,) = runs(rmq_env, "twelve")
    assert run["t"] >= sent + 12, run["t"] - sent
    # Within ~2 s: the broker expires a level queue's head on time; 3 s of slack for a
    # loaded 2-core machine (the worker's clock, the same machine as `sent`).
    assert run["t"] - (sent + 12) < 3.0, run["t"] - sent
    time.sleep(1)  # a second copy would have come with the first
    assert len(runs(rmq_env, "twelve")) == 1


def test_a_sub_second_countdown_does_not_raise_and_runs(
    rmq_env: dict[str, str], fast_worker: WorkerProcess, tasks: Any
) -> None:
    sent = time.time()
    result = tasks.record_run.apply_async(("subsecond",), countdown=0.3)
    assert result.get(timeout=30) == "ran"
    (run,) = runs(rmq_env, "subsecond")
    assert run["t"] >= sent + 0.3


def test_a_worker_sigkilled_mid_job_has_it_redelivered_and_finished(
    rmq_env: dict[str, str], tasks: Any, tmp_path: Path, fast_worker: WorkerProcess
) -> None:
    # The module's worker consumes fast too: stop it so the job lands on the victim.
    fast_worker.stop()
    try:
        victim = worker(rmq_env, tmp_path).start()
        result = tasks.slow.delay("killed", 3.0)
        wait_for(lambda: runs(rmq_env, "killed"), timeout_s=30, message="the job to start")
        victim.kill()  # the whole worker, SIGKILL: no ack, no goodbye
        with worker(rmq_env, tmp_path):
            assert result.get(timeout=40) == "done"
        phases = [r["phase"] for r in runs(rmq_env, "killed")]
        assert phases == ["start", "start", "end"], phases
    finally:
        fast_worker.start()


def test_revoke_reaches_a_delayed_job_that_no_live_worker_knows(
    redis_url: str, module_pg_url: str, tmp_path: Path
) -> None:
    with rabbitmq_vhost() as url:
        env = {
            "JOBS_BROKER_URL": url,
            "JOBS_COORDINATION_URL": redis_url,
            "JOBS_DATABASE_URL": module_pg_url,
        }
        with environment(env):
            full_env = {**env, "PYTHONPATH": str(ROOT)}
            app = rabbitmq_app.make_app()
            tasks = rabbitmq_app.declare(app)
            with worker(full_env, tmp_path):
                pass  # declares the topology and delayed delivery, then stops
            revoked = tasks.record_run.apply_async(("revoked",), countdown=5)
            kept = tasks.record_run.apply_async(("kept",), countdown=5)
            revoked.revoke()  # no worker is up: Celery's broadcast reaches no one
            with worker(full_env, tmp_path):
                assert kept.get(timeout=40) == "ran"
                wait_for(
                    lambda: revoked.state == "REVOKED",
                    timeout_s=20,
                    message=lambda: f"the revoked job REVOKED (now {revoked.state})",
                )
            assert runs(env, "revoked") == []


def test_a_classic_queue_of_the_same_name_refuses_the_worker_with_a_clear_error(
    redis_url: str, module_pg_url: str, tmp_path: Path
) -> None:
    with rabbitmq_vhost() as url:
        with kombu.Connection(url) as conn:
            conn.default_channel.queue_declare("fast", durable=True, auto_delete=False)  # classic
        env = {
            "JOBS_BROKER_URL": url,
            "JOBS_COORDINATION_URL": redis_url,
            "JOBS_DATABASE_URL": module_pg_url,
            "PYTHONPATH": str(ROOT),
        }
        proc = worker(env, tmp_path)
        with pytest.raises(RuntimeError) as refused:
            proc.start(timeout_s=60)
        log = proc.log()
        assert "queue 'fast' is a classic queue" in log, log[-3000:]
        assert "new vhost" in log and "delete_queue -p" in log
        assert "Traceback" not in log, log[-3000:]  # one clear message, not a stack trace
        assert "exited with" in str(refused.value)
        vhost = url.rsplit("/", 1)[1]
        types = {r["name"]: r["type"] for r in list_queues(vhost, "name", "type")}
        assert types["fast"] == "classic"  # left as it was: never a silent mix
