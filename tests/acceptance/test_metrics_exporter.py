"""The exporter as deployed: a real prefork worker (children recycled every 2 tasks, task
events off) runs a workload; ``celery -A ... metrics`` runs as its own process; the test
scrapes it over HTTP and parses the text with prometheus-client's parser."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs_platform import create_app
from jobs_platform.testing import RedisServer, WorkerProcess, free_port, port_answers, wait_for
from tests.support.metrics_app import declare, samples, value

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.support.metrics_app"
Parsed = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A Redis and a database of this module's own: the counters hash and the dead-letter
    table hold exactly this module's workload."""
    with RedisServer() as server:
        yield {
            "JOBS_BROKER_URL": server.url,
            "JOBS_RESULT_BACKEND": "",
            "JOBS_DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('db')}/metrics.sqlite3",
            # Metrics must not depend on task events.
            "JOBS_TASK_EVENTS": "0",
            "PYTHONPATH": str(ROOT),
        }


@pytest.fixture(scope="module")
def tasks(services: dict[str, str]) -> dict[str, Any]:
    app = create_app(
        "metricsapp",
        broker_url=services["JOBS_BROKER_URL"],
        result_backend="",
        database_url=services["JOBS_DATABASE_URL"],
    )
    return declare(app)


@pytest.fixture(scope="module")
def exporter_url(
    services: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("exporter") / "exporter.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", APP, "metrics", "--port", str(port)],
            env={**os.environ, **services},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: proc.poll() is None and port_answers("127.0.0.1", port),
            timeout_s=30,
            message=lambda: f"the exporter on port {port}:\n{log_path.read_text()[-2000:]}",
        )
        yield f"http://127.0.0.1:{port}/metrics"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log_path.read_text()[-2000:]  # a clean stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def scrape(url: str) -> Parsed:
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        return samples(answer.read().decode())


def by_task(name: str, **counts: float) -> dict[tuple[str, str], float]:
    return {(sample, name): n for sample, n in counts.items()}


#: What the workload below must produce, per (sample, task name), on the "fast" queue.
EXPECTED = {
    # 6 successes; 2 jobs failing twice then succeeding; 2 permanent failures; 1 job
    # failing twice with max_retries=1 (its second failure gives up).
    **by_task("metrics.ok", received=6, started=6, succeeded=6, runtime=6),
    **by_task("metrics.flaky", received=6, started=6, succeeded=2, retried=4, runtime=6),
    **by_task("metrics.permanent", received=2, started=2, runtime=2),
    **by_task("metrics.exhausted", received=2, started=2, retried=1, runtime=2),
}
FAILED = {("metrics.permanent", "PermanentError"): 2, ("metrics.exhausted", "ConnectionError"): 1}
SAMPLES = {
    "received": "celery_task_received_total",
    "started": "celery_task_started_total",
    "succeeded": "celery_task_succeeded_total",
    "retried": "celery_task_retried_total",
    "runtime": "celery_task_runtime_count",
}


def task_counts(parsed: Parsed, *, zeros: bool = False) -> dict[tuple[str, str], float]:
    """The counts of the workload's tasks (the series served at 0 left out unless ``zeros``:
    every known task's series exists from the exporter's start)."""
    counts = {}
    for (sample, labels), count in parsed.items():
        short = next((k for k, v in SAMPLES.items() if v == sample), None)
        label = dict(labels)
        if short is not None and label.get("name", "").startswith("metrics."):
            assert label["queue_name"] == "fast"
            if count or zeros:
                counts[(short, label["name"])] = count
    return counts


def failures(parsed: Parsed) -> dict[tuple[str, str], float]:
    return {
        (dict(labels)["name"], dict(labels)["exception"]): count
        for (sample, labels), count in parsed.items()
        if sample == "celery_task_failed_total"
    }


def test_counts_from_recycled_prefork_children_reach_the_exporter(
    services: dict[str, str], tasks: dict[str, Any], exporter_url: str, tmp_path: Path
) -> None:
    worker = WorkerProcess(
        APP,
        ["fast"],
        concurrency=2,
        env=services,
        cwd=ROOT,
        log_dir=str(tmp_path),
        extra_args=["--max-tasks-per-child", "2"],
    )
    with worker:
        assert "task events: OFF" in worker.log()
        results = [tasks["ok"].delay(n) for n in range(6)]
        results += [tasks["flaky"].delay(2) for _ in range(2)]
        results += [tasks["permanent"].delay(n) for n in range(2)]
        results += [tasks["exhausted"].delay(1)]
        wait_for(
            lambda: all(r.state in ("SUCCESS", "FAILURE") for r in results),
            timeout_s=60,
            message=lambda: f"the workload to finish: {[r.state for r in results]}",
        )

        def complete() -> Parsed | None:
            parsed = scrape(exporter_url)
            done = task_counts(parsed) == EXPECTED and failures(parsed) == FAILED
            return parsed if done else None

        parsed = wait_for(
            complete,
            timeout_s=30,
            interval_s=0.5,
            message=lambda: f"the workload's counts, got {task_counts(scrape(exporter_url))}",
        )
        # What never happened is there too, at 0 (a dashboard shows 0, an alert's increase()
        # sees the first event).
        assert task_counts(parsed, zeros=True)[("succeeded", "metrics.permanent")] == 0
        # The work ran in many short-lived children (numbered from 1 as billiard forks them).
        children = {int(n) for n in re.findall(r"ForkPoolWorker-(\d+)", worker.log())}
        assert max(children) >= 5, sorted(children)
        assert value(parsed, "celery_worker_up", hostname=worker.hostname) == 1
        dead = {"task": "metrics.permanent", "queue": "fast", "reason": "permanent"}
        assert value(parsed, "jobs_dead_letters_total", **dead) == 2
        exhausted = {"task": "metrics.exhausted", "queue": "fast", "reason": "exhausted"}
        assert value(parsed, "jobs_dead_letters_total", **exhausted) == 1
        assert value(parsed, "jobs_dead_letters_stored", status="dead", reason="permanent") == 2
        assert value(parsed, "jobs_dead_letters_stored", status="dead", reason="exhausted") == 1
        assert value(parsed, "jobs_dead_letter_spool_depth", list="spool") == 0
        assert value(parsed, "jobs_exporter_source_up", source="database") == 1

    # After a warm shutdown (every child and the main process flush): the same totals,
    # nothing counted twice, and a worker that stopped cleanly is no longer listed.
    after = scrape(exporter_url)
    assert task_counts(after) == EXPECTED and failures(after) == FAILED
    assert value(after, "celery_worker_up", hostname=worker.hostname) is None


def test_queue_length_and_age_with_no_worker_running(
    tasks: dict[str, Any], exporter_url: str
) -> None:
    for n in range(3):
        tasks["ok"].delay(n)
    for n in range(2):
        tasks["ok"].apply_async((n,), priority=9)  # another sub-list of the same queue
    try:
        parsed = scrape(exporter_url)
        assert value(parsed, "celery_queue_length", queue_name="fast") == 5
        assert value(parsed, "celery_queue_length", queue_name="heavy") == 0
        age = value(parsed, "jobs_queue_oldest_age_seconds", queue_name="fast")
        assert age is not None and 0 <= age < 60
        assert value(parsed, "jobs_inflight", queue_name="fast") == 0
    finally:
        with tasks["ok"].app.connection_for_write() as conn:
            conn.default_channel.queue_purge("fast")
