"""A ``thirdparty`` worker (gevent pool, -c 100, prefetch 1) on RabbitMQ takes every job.

Two faults this catches, both seen on the demo: a job retried twice through the same delay
level never came back (its ``x-death`` made RabbitMQ see a dead-letter cycle and hold it in
``celery_delayed_N``), and Celery's green loop waited 0.1 s on the event connection after
every message (at most ~10 jobs a second, and a second reader of a socket on which event
publishes wait for confirms). See jobs_platform/brokers/rabbitmq/dispatch.py and consumer.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import WorkerProcess, wait_for
from jobs_platform.testing.rabbitmq import available, list_queues, rabbitmq_vhost
from tests.support import rabbitmq_app

ROOT = Path(__file__).resolve().parents[2]
JOBS = 100
FAILING = range(0, JOBS, 10)  # always_fails: retried twice (delays of 1-3 s), then dead

pytestmark = pytest.mark.skipif(not available(), reason="RabbitMQ does not answer")


@contextlib.contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
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


def most_at_once(runs: list[dict[str, Any]]) -> int:
    """How many ``slow`` runs overlapped at most (from their recorded starts and ends)."""
    edges = sorted((r["t"], 1 if r["phase"] == "start" else -1) for r in runs)
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_a_gevent_worker_ends_every_job_retries_included(
    redis_url: str, module_pg_url: str, tmp_path: Path
) -> None:
    with rabbitmq_vhost() as url:
        env = {
            "JOBS_BROKER_URL": url,
            "JOBS_COORDINATION_URL": redis_url,
            "JOBS_DATABASE_URL": module_pg_url,
        }
        vhost = url.rsplit("/", 1)[1]
        with environment(env):
            tasks = rabbitmq_app.declare(rabbitmq_app.make_app())
            proc = WorkerProcess.for_profile(
                "tests.support.rabbitmq_app",
                "thirdparty",
                env={**env, "PYTHONPATH": str(ROOT)},
                cwd=str(ROOT),
                log_dir=str(tmp_path),
            )
            with proc:
                results = [
                    tasks.always_fails.apply_async((f"f{n}",), queue="thirdparty")
                    if n in FAILING
                    else tasks.slow.apply_async((f"s{n}", 0.5), queue="thirdparty")
                    for n in range(JOBS)
                ]

                def left() -> list[dict[str, str]]:
                    rows = list_queues(vhost, "name", "messages", "messages_ready")
                    return [r for r in rows if r["messages"] != "0"]

                wait_for(
                    lambda: all(r.ready() for r in results),
                    timeout_s=90,
                    message=lambda: (
                        f"every job to end; left in the broker: {left()}\n{proc.log()[-3000:]}"
                    ),
                )
                store = DeadLetterStore(module_pg_url)
                for n in FAILING:
                    (row,) = store.by_task_id(results[n].id)
                    assert row["reason"] == "exhausted"
                wait_for(lambda: not left(), timeout_s=30, message=lambda: f"empty: {left()}")
                log = proc.log()
        coordination = env["JOBS_COORDINATION_URL"]
        slow = [
            r
            for n in range(JOBS)
            if n not in FAILING
            for r in rabbitmq_app.runs(coordination, f"s{n}")
        ]
    assert len(slow) == 2 * (JOBS - len(FAILING))  # each ran once: a start and an end
    # 100 greenlets: the prefetched jobs run side by side (one at a time at 10 a second
    # before the fix: 0.5 s jobs overlapped 5 at most).
    assert most_at_once(slow) >= 20, most_at_once(slow)
    assert "time limit" not in log.lower(), log[-3000:]
