"""Flow control on real workers and the real Redis (jobs_platform/flow): per-key
concurrency across workers and queues, a killed holder's slot freed within the worker
lease, and debounce collapsing a storm into one run with the last arguments.

Times are read on the Redis clock (``TIME``, stamped by the tasks and the test), so a
loaded machine cannot move them; each test prints what it measured.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

APP = "tests.support.flow_app"
#: JOBS_WORKER_LEASE's default: a killed holder's slot runs out within it.
LEASE_S = 15.0


@pytest.fixture(scope="module")
def flow_app(worker_env: dict[str, str]) -> Any:
    from tests.support import flow_app

    return flow_app


def worker(env: dict[str, str], tmp: Path, name: str, queues: list[str], **kw: Any) -> Any:
    return WorkerProcess(
        APP,
        queues,
        env=env,
        cwd=str(ROOT),
        log_dir=str(tmp),
        hostname=f"{name}-{uuid.uuid4().hex[:6]}@flow",
        **kw,
    )


@pytest.fixture(scope="module")
def two_workers(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, flow_app: Any
) -> Iterator[list[WorkerProcess]]:
    tmp = tmp_path_factory.mktemp("flow")
    procs = [
        worker(worker_env, tmp, f"w{i}", ["fast", "thirdparty"], concurrency=3) for i in range(2)
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


def intervals(events: list[dict[str, Any]], account: str) -> list[tuple[float, float]]:
    starts = {
        e["task_id"]: e["t"] for e in events if e["kind"] == "start" and e["account"] == account
    }
    ends = {e["task_id"]: e["t"] for e in events if e["kind"] == "end" and e["account"] == account}
    return sorted((starts[i], ends[i]) for i in starts if i in ends)


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_a_killed_holders_slot_frees_within_the_worker_lease(
    flow_app: Any, worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    # First in the module: the module's two workers are not started yet, so these two are
    # the only consumers.
    tag = uuid.uuid4().hex[:8]
    # The holder's worker only consumes thirdparty; the waiter goes to fast, which only the
    # survivor consumes, so every copy of the waiter is the survivor's.
    with worker(worker_env, tmp_path, "doomed", ["thirdparty"], concurrency=2) as doomed:
        flow_app.per_account.apply_async((tag, "A", 0, 300.0), queue="thirdparty")
        [held] = wait_for(lambda: flow_app.events(tag), timeout_s=30, message="the holder")
        assert held["host"] == doomed.hostname
        with worker(
            worker_env, tmp_path, "survivor", ["fast", "thirdparty"], concurrency=2
        ) as survivor:
            flow_app.per_account.apply_async((tag, "A", 1, 0.5), queue="fast")
            # The waiter is waiting (it asked and was deferred), not running.
            wait_for(
                lambda: redis_client.zcard(f"jobs:flow:conc:{tag}:A:waiting") == 1,
                timeout_s=30,
                message="the waiter on the wait list",
            )
            killed_at = flow_app.redis_now()
            doomed.kill()
            started = wait_for(
                lambda: [e for e in flow_app.events(tag) if e["kind"] == "start" and e["n"] == 1],
                timeout_s=60,
                message="the waiter to start",
            )[0]
            after = started["t"] - killed_at
            print(
                f"\nholder SIGKILLed: the waiter started {after:.1f} s later (lease {LEASE_S:g} s)"
            )
            assert started["host"] == survivor.hostname
            assert started["retries"] == 0
            # The lease, plus the slack a loaded 2-core machine needs to start a run.
            assert after <= LEASE_S + 5.0
            # The holder never ended, so no release woke the waiter: its slot ran out.
            assert not [e for e in flow_app.events(tag) if e["kind"] == "end" and e["n"] == 0]
            # The killed job itself comes back (a lost attempt) and now ends at once.
            redis_client.set(f"jptest:flow:release:{tag}", "1")
            wait_for(
                lambda: [e for e in flow_app.events(tag) if e["kind"] == "end" and e["n"] == 0],
                timeout_s=90,
                message="the killed job to run again and end",
            )


def test_one_job_per_account_at_a_time_across_workers_and_queues(
    flow_app: Any, two_workers: list[WorkerProcess]
) -> None:
    tag = uuid.uuid4().hex[:8]
    results = []
    for n in range(6):
        for account in ("A", "B"):
            # Half of them on another queue: the limit is the key's, not a queue's.
            queue = "fast" if n % 2 else "thirdparty"
            results.append(flow_app.per_account.apply_async((tag, account, n, 0.5), queue=queue))
    wait_for(
        lambda: sum(e["kind"] == "end" for e in flow_app.events(tag)) >= 12,
        timeout_s=90,
        message="12 runs",
    )
    events = flow_app.events(tag)
    starts = [e for e in events if e["kind"] == "start"]
    a, b = intervals(events, "A"), intervals(events, "B")
    print(
        f"\n6+6 jobs, limit 1: A ran {a[-1][1] - a[0][0]:.1f} s, B {b[-1][1] - b[0][0]:.1f} s, "
        f"{sum(overlaps(x, y) for x in a for y in b)} A/B overlaps, hosts "
        f"{sorted({e['host'] for e in starts})}"
    )
    assert len(starts) == 12  # each job ran exactly once
    assert sorted((e["account"], e["n"]) for e in starts) == sorted(
        (acc, n) for n in range(6) for acc in ("A", "B")
    )
    assert len({e["task_id"] for e in starts}) == 12
    for runs in (a, b):
        assert len(runs) == 6
        assert not any(overlaps(x, y) for i, x in enumerate(runs) for y in runs[i + 1 :])
    assert any(overlaps(x, y) for x in a for y in b)  # A and B ran in parallel
    assert {e["retries"] for e in starts} == {0}  # waiting burned no attempt
    assert len({e["host"] for e in starts}) == 2  # both workers took part
    for result in results:
        assert result.get(timeout=30) is None


def test_a_storm_of_dispatches_is_one_run_with_the_last_arguments(
    flow_app: Any, two_workers: list[WorkerProcess], redis_client: redis.Redis
) -> None:
    tag = uuid.uuid4().hex[:8]
    ids = []
    last_at = 0.0
    for version in range(10):
        if version == 9:
            last_at = flow_app.redis_now()  # at most the last dispatch's time
        ids.append(flow_app.reindex.delay(tag, 42, version).id)
        time.sleep(0.05)
    assert len(set(ids)) == 1  # every dispatch got the id of the one run
    [run] = wait_for(
        lambda: [e for e in flow_app.events(tag) if e["kind"] == "run"],
        timeout_s=30,
        message="the debounced run",
    )
    print(
        f"\n10 dispatches, debounce 2 s: the run started {run['t'] - last_at:.2f} s after the last"
    )
    assert run["version"] == 9 and run["task_id"] == ids[0]
    assert run["t"] >= last_at + 2.0
    assert flow_app.reindex.AsyncResult(ids[0]).get(timeout=30) is None
    # Nothing else is to run: the window and its released record are gone.
    assert not redis_client.exists(f"jobs:flow:debounce:flow.reindex:{tag}:42")
    assert not redis_client.exists(f"jobs:flow:debounce:released:{ids[0]}")
    assert len([e for e in flow_app.events(tag) if e["kind"] == "run"]) == 1
