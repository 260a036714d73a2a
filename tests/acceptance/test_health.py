"""``celery -A APP health`` against real workers: healthy, then each worker-side failure.

One worker per queue, started once for the module, each exactly as its ``worker-profile``
starts it (one pool process each), on a private redis-server and SQLite file of this
module's own, so no canary is ever left for another module's workers. The health command
always runs as a real subprocess. Failures that need no worker (broker, database, spool,
beat, backlog) are in tests/integration/redis/test_health.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform import create_app
from jobs_platform.routing import QUEUE_NAMES
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

APP = "tests.support.health_app"


class Stack:
    """A worker per queue; a test that stops one starts it again."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.workers: dict[str, WorkerProcess] = {}

    def worker(self, queue: str) -> WorkerProcess:
        return WorkerProcess.for_profile(
            APP, queue, concurrency=1, env=self.env, cwd=ROOT, log_dir=str(self.log_dir)
        )

    def start(self, *queues: str) -> None:
        for queue in queues:
            self.workers[queue] = self.worker(queue).start(wait=False)
        for queue in queues:
            self.workers[queue].wait_ready()

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.signal(signal.SIGCONT, group=True)  # a failed test may leave one stopped
            worker.stop()

    def health(self, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "health", *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
        return done, time.monotonic() - start

    def checks(self, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
        done, _ = self.health("--json", *args)
        report = json.loads(done.stdout)
        return done.returncode, {check["name"]: check for check in report["checks"]}

    def wait_healthy(self, queue: str) -> None:
        """Poll until ``queue``'s canary comes back (a resumed worker catches up), then check
        that no canary became a dead letter: the late ones ran as no-ops."""
        wait_for(
            lambda: self.health("--queue", queue, "--check", "canary")[0].returncode == 0,
            timeout_s=60,
            interval_s=0.2,
            message=f"{queue} to be healthy again",
        )
        from jobs_platform.deadletter.store import DeadLetterStore, Filter

        store = DeadLetterStore(self.env["JOBS_DATABASE_URL"])
        assert store.count(Filter()) == 0, store.listing(Filter(), page=1, page_size=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("health")
    with RedisServer() as server:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "JOBS_BROKER_URL": server.url,
            "JOBS_DATABASE_URL": f"sqlite:///{tmp}/jobs.sqlite3",
        }
        env.pop("JPTEST_HEALTH_BEAT", None)
        stack = Stack(env, tmp)
        try:
            stack.start(*QUEUE_NAMES)
            yield stack
        finally:
            stack.stop()


def pool_children(worker: WorkerProcess) -> list[int]:
    assert worker.process is not None
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(worker.process.pid)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return [int(pid) for pid in out.split()]


def test_a_healthy_stack_passes_every_check_quickly(stack: Stack) -> None:
    done, took = stack.health()
    assert done.returncode == 0, done.stdout
    assert done.stdout.splitlines()[-1].startswith("healthy: 14 checks passed in ")
    code, checks = stack.checks()
    assert code == 0
    assert sorted(checks) == sorted(
        ["broker", "database", "beat", "spool", "breakers"]
        + [f"{check}:{q}" for check in ("consumers", "canary", "backlog") for q in QUEUE_NAMES]
    )
    for queue in QUEUE_NAMES:
        assert checks[f"consumers:{queue}"]["detail"] == (
            f"consumed by {stack.workers[queue].hostname}"
        )
        assert checks[f"canary:{queue}"]["detail"].startswith("round trip ")
    # A container health check: the whole process, interpreter start included. Reported,
    # not asserted (no timed assertions); the bound is the command's --timeout.
    print(f"\nhealthy stack: `health` took {took:.2f} s wall")


def test_health_and_inspect_runs_leave_nothing_behind_in_the_broker(stack: Stack) -> None:
    """Their control replies are consumed without acks: nothing stays in ``unacked`` and
    the exporter grows no series for a reply queue (health in a compose file runs every
    60 s, for ever; Flower broadcasts every 5 s)."""
    from jobs_platform.exporter.server import exposition

    url = stack.env["JOBS_BROKER_URL"]
    raw = redis.Redis.from_url(url)
    app = create_app("healthleak", broker_url=url, database_url=stack.env["JOBS_DATABASE_URL"])

    def inflight_series() -> set[str]:
        return {
            line.split(" ")[0]
            for line in exposition(app).splitlines()
            if line.startswith("jobs_inflight{")
        }

    before = (raw.hlen("unacked"), inflight_series())
    for _ in range(20):
        done, _took = stack.health("--check", "consumers", "--check", "canary", "--timeout", "10")
        assert done.returncode == 0, done.stdout + done.stderr
    inspected = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "inspect", "active_queues", "--timeout", "2"],
        env=stack.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert inspected.returncode == 0, inspected.stdout + inspected.stderr
    # What Flower sends while it watches: enable_events every 5 s (the workers' task events
    # lease), and inspect calls for its workers page; each must leave nothing behind either.
    for _ in range(10):
        app.control.enable_events()
        assert app.control.inspect(timeout=2).stats(), "no worker answered Flower's inspect"
    after = (raw.hlen("unacked"), inflight_series())
    raw.close()
    print(
        f"\n20 health runs + an inspect + 10 of Flower's broadcasts: unacked {before[0]} -> "
        f"{after[0]}, series {after[1]}"
    )
    assert after == before
    assert all('queue_name="' + q in " ".join(after[1]) for q in QUEUE_NAMES)


def test_a_worker_container_checks_only_its_own_queue(stack: Stack) -> None:
    code, checks = stack.checks("--queue", "fast")
    assert code == 0
    per_queue = [name for name in checks if ":" in name]
    assert sorted(per_queue) == ["backlog:fast", "canary:fast", "consumers:fast"]


def test_a_stopped_worker_leaves_its_queue_without_consumer(stack: Stack) -> None:
    stack.workers["fast"].stop()
    try:
        code, checks = stack.checks("--queue", "fast", "--check", "consumers", "--check", "canary")
        assert code == 1
        assert not checks["consumers:fast"]["ok"]
        assert checks["consumers:fast"]["detail"].startswith(
            "no worker consumes fast (2 worker(s) answered within 1 s, none for fast)"
        )
        assert not checks["canary:fast"]["ok"]
        assert "no worker consumes fast" in checks["canary:fast"]["detail"]
        # The other queues are unaffected.
        code, _ = stack.checks("--queue", "heavy", "--check", "consumers")
        assert code == 0
    finally:
        stack.start("fast")
    stack.wait_healthy("fast")


def test_a_sigstopped_worker_fails_the_canary(stack: Stack) -> None:
    heavy = stack.workers["heavy"]
    heavy.signal(signal.SIGSTOP, group=True)
    try:
        code, checks = stack.checks("--queue", "heavy", "--check", "consumers", "--check", "canary")
    finally:
        heavy.signal(signal.SIGCONT, group=True)
    assert code == 1
    assert not checks["canary:heavy"]["ok"]
    # Observed: a stopped main process cannot answer the control broadcast either, so the
    # worker also drops out of the consumer list.
    assert not checks["consumers:heavy"]["ok"]
    assert "none for heavy" in checks["consumers:heavy"]["detail"]
    stack.wait_healthy("heavy")


def test_a_worker_alive_but_not_consuming_fails_only_the_canary(stack: Stack) -> None:
    # A prefork worker (thirdparty runs gevent: one process, no pool children to stop).
    worker = stack.workers["fast"]
    children = pool_children(worker)
    assert len(children) == 1
    # The main process still answers the broker and control pings; nothing runs a job.
    for pid in children:
        os.kill(pid, signal.SIGSTOP)
    try:
        code, checks = stack.checks("--queue", "fast", "--check", "consumers", "--check", "canary")
    finally:
        for pid in children:
            os.kill(pid, signal.SIGCONT)
    assert code == 1
    assert checks["consumers:fast"]["ok"]
    detail = checks["canary:fast"]["detail"]
    assert not checks["canary:fast"]["ok"]
    assert detail.startswith("no canary back within ")
    assert f"alive but not consuming? ({worker.hostname}: 0/1 running, 0 started" in detail
    stack.wait_healthy("fast")


def test_a_busy_queue_is_not_a_stuck_one(stack: Stack) -> None:
    producer = create_app("healthproducer", broker_url=stack.env["JOBS_BROKER_URL"])
    client = redis.Redis.from_url(stack.env["JOBS_BROKER_URL"])
    marker = f"jptest:running:{uuid.uuid4().hex}"
    # Longer than one health run: the canary cannot come back while it holds the only slot.
    producer.send_task("health.sleep", (8, marker), queue="heavy")
    wait_for(lambda: client.exists(marker), timeout_s=30, message="the long job to start")
    code, checks = stack.checks("--queue", "heavy", "--check", "canary")
    assert code == 0, checks
    assert checks["canary:heavy"]["detail"].startswith(
        f"busy: canary waits behind running jobs ({stack.workers['heavy'].hostname}: 1/1 running"
    )
    client.close()
    stack.wait_healthy("heavy")
