"""Fairness between tenants on a real worker and the real Redis (``fairness_key``): a small
tenant's jobs dispatched after a big tenant's backlog start long before it drains, and a
key function that fails on the arguments is refused at dispatch with nothing sent.

The order of starts is the order the jobs pushed themselves to one Redis list, so a loaded
machine cannot reorder it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform import DispatchError
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

APP = "tests.support.flow_app"
BIG, SMALL = 400, 10


@pytest.fixture(scope="module")
def flow_app(worker_env: dict[str, str]) -> Any:
    from tests.support import flow_app

    return flow_app


@pytest.fixture(scope="module")
def one_worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, flow_app: Any
) -> Iterator[WorkerProcess]:
    proc = WorkerProcess(
        APP,
        ["heavy"],
        env=worker_env,
        cwd=str(ROOT),
        log_dir=str(tmp_path_factory.mktemp("fair")),
        hostname=f"fair-{uuid.uuid4().hex[:6]}@flow",
        concurrency=1,
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def test_a_keyed_job_of_a_sigkilled_worker_runs_again(
    flow_app: Any,
    worker_env: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    redis_client: redis.Redis,
) -> None:
    # First in the module: the module's worker is not started yet, so these are the only
    # consumers of heavy.
    tag = uuid.uuid4().hex[:8]
    tmp = tmp_path_factory.mktemp("fair-kill")
    starts = f"jptest:fair:{tag}"

    def worker(name: str) -> WorkerProcess:
        return WorkerProcess(
            APP,
            ["heavy"],
            env=worker_env,
            cwd=str(ROOT),
            log_dir=str(tmp),
            hostname=f"{name}-{uuid.uuid4().hex[:6]}@flow",
            concurrency=1,
        )

    with worker("doomed") as doomed:
        flow_app.tenant_job.delay(tag, "victim", 0, 300.0)
        wait_for(lambda: redis_client.llen(starts) == 1, timeout_s=30, message="the first run")
        doomed.kill()
    redis_client.set(f"jptest:fair:release:{tag}", "1")  # the second run ends at once
    with worker("survivor"):
        wait_for(
            lambda: redis_client.llen(starts) >= 2,
            timeout_s=90,
            message="the killed worker's keyed job to run again",
        )
    assert redis_client.lrange(starts, 0, -1) == ["victim:0", "victim:0"]


def test_a_small_tenant_after_a_big_backlog_starts_long_before_it_drains(
    flow_app: Any, one_worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    tag = uuid.uuid4().hex[:8]
    task = flow_app.tenant_job
    task.delay_many([(tag, "big", n) for n in range(BIG)])
    started_before_small = redis_client.llen(f"jptest:fair:{tag}")
    for n in range(SMALL):
        task.delay(tag, "small", n)

    wait_for(
        lambda: redis_client.llen(f"jptest:fair:{tag}") >= BIG + SMALL,
        timeout_s=180,
        message="every job to start",
    )
    order = redis_client.lrange(f"jptest:fair:{tag}", 0, -1)
    assert sorted(order) == sorted(
        [f"big:{n}" for n in range(BIG)] + [f"small:{n}" for n in range(SMALL)]
    )
    last_small = max(i for i, job in enumerate(order) if job.startswith("small:"))
    big_before = sum(1 for job in order[:last_small] if job.startswith("big:"))
    print(
        f"\nfairness: {started_before_small} of big's {BIG} had started when small's {SMALL} "
        f"were dispatched; all of small's started after {big_before} of big's"
    )
    assert big_before < 100
    # Each tenant's own jobs start in the order they were dispatched.
    assert [j for j in order if j.startswith("small:")] == [f"small:{n}" for n in range(SMALL)]


def test_a_fairness_key_failing_on_the_arguments_is_refused_at_dispatch(
    flow_app: Any, redis_client: redis.Redis
) -> None:
    ring = "heavy\x06\x16fair"  # the queue's ring of keys (jobs_platform/brokers/redis/fair.py)
    before = int(redis_client.get(ring + "#") or 0)
    with pytest.raises(DispatchError, match="fairness_key must return a non-empty str, got 3"):
        flow_app.tenant_job.delay("t", 3, 1)  # the tenant argument is not a string
    with pytest.raises(DispatchError, match=r"fairness_key failed .* TypeError"):
        flow_app.tenant_job.delay("t")
    assert int(redis_client.get(ring + "#") or 0) == before  # nothing sent
    assert redis_client.llen(ring + ":t") == 0
