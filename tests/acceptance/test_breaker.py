"""The circuit breaker on real workers (two, three pool processes each) and the real Redis
(jobs_platform/flow/breaker.py): a downstream failing every call opens the breaker after
its threshold, its jobs are deferred without burning attempts and none is dead-lettered,
and once the downstream is back one probe closes the breaker and every job runs once.

The order of starts is read on the Redis clock (``TIME``, stamped by the tasks), so a
loaded machine cannot move it; nothing here asserts a duration.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform.coordination.lease import text
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.exporter.server import exposition
from jobs_platform.flow import breaker
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

KEY = "flaky-partner"
JOBS = 20
THRESHOLD = 3
#: Jobs that may already be past the breaker when it opens: every pool process of both.
IN_FLIGHT = 2 * 3


@pytest.fixture(scope="module")
def flow_app(worker_env: dict[str, str]) -> Any:
    from tests.support import flow_app

    return flow_app


@pytest.fixture(scope="module")
def two_workers(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, flow_app: Any
) -> Iterator[list[WorkerProcess]]:
    tmp = tmp_path_factory.mktemp("breaker")
    procs = [
        WorkerProcess(
            "tests.support.flow_app",
            ["fast"],
            env=worker_env,
            cwd=str(ROOT),
            log_dir=str(tmp),
            hostname=f"b{i}-{uuid.uuid4().hex[:6]}@breaker",
            concurrency=3,
        )
        for i in range(2)
    ]
    for proc in procs:
        proc.start(wait=False)
    try:
        for proc in procs:
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def state(client: redis.Redis) -> str:
    raw = client.hget(breaker.state_key(KEY), "state")
    return "closed" if raw is None else text(raw)


def opens(client: redis.Redis) -> int:
    return int(client.hget(breaker.state_key(KEY), "opens") or 0)


def served(app: Any, sample: str) -> float | None:
    prefix = f'{sample}{{key="{KEY}"}} '
    for line in exposition(app).splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def test_an_outage_opens_the_breaker_without_dead_letters_and_one_probe_closes_it(
    flow_app: Any,
    two_workers: list[WorkerProcess],
    redis_client: redis.Redis,
    worker_env: dict[str, str],
) -> None:
    tag = uuid.uuid4().hex[:8]
    redis_client.set(flow_app.DOWN_FLAG, "1")
    ids = [flow_app.downstream.delay(tag, n).id for n in range(JOBS)]

    wait_for(lambda: state(redis_client) != "closed", timeout_s=60, message="the breaker open")
    assert served(flow_app.app, "jobs_breaker_state") in (1.0, 2.0)
    # Keep the partner down through two cool-downs: at least one probe fails and re-opens.
    wait_for(lambda: opens(redis_client) >= 3, timeout_s=90, message="two failed probes")
    failed = [e for e in flow_app.events(tag) if e["kind"] == "fail"]
    assert not [e for e in flow_app.events(tag) if e["kind"] == "start"]
    # Only the threshold, the calls already under way and one probe per cool-down reached
    # the partner; 20 jobs of 21 attempts each would have made up to 420 calls.
    print(f"\npartner down: {len(failed)} calls failed, breaker opened {opens(redis_client)}x")
    assert len(failed) <= THRESHOLD + IN_FLIGHT + opens(redis_client)
    store = DeadLetterStore(worker_env["JOBS_DATABASE_URL"])
    assert store.count(Filter(task="flow.downstream")) == 0

    redis_client.delete(flow_app.DOWN_FLAG)
    wait_for(
        lambda: len({e["task_id"] for e in flow_app.events(tag) if e["kind"] == "end"}) >= JOBS,
        timeout_s=120,
        message="every job to run once the partner is back",
    )
    assert state(redis_client) == "closed"
    events = flow_app.events(tag)
    starts = sorted((e for e in events if e["kind"] == "start"), key=lambda e: e["t"])
    ends = {e["task_id"]: e["t"] for e in events if e["kind"] == "end"}
    # Every job ran once to its end, and no job ran twice.
    assert sorted(e["task_id"] for e in starts) == sorted(ids)
    # One probe closed it: the first success had ended before any other job started.
    probe = starts[0]
    assert all(ends[probe["task_id"]] <= later["t"] for later in starts[1:])
    # Deferrals burned no attempt: each job's retries are its own failed calls.
    fails_by_job: dict[str, int] = {}
    for e in events:
        if e["kind"] == "fail":
            fails_by_job[e["task_id"]] = fails_by_job.get(e["task_id"], 0) + 1
    for start in starts:
        assert start["retries"] == fails_by_job.get(start["task_id"], 0), start
    assert store.count(Filter(task="flow.downstream")) == 0
    assert served(flow_app.app, "jobs_breaker_state") == 0.0
    deferred = wait_for(
        lambda: served(flow_app.app, "jobs_breaker_deferred_total") or None,
        timeout_s=30,
        message="the deferrals counted",
    )
    print(
        f"partner back: {len(starts)} jobs ran once, probe {probe['task_id']}; "
        f"{deferred:g} deferrals, {sum(fails_by_job.values())} failed calls in all"
    )
