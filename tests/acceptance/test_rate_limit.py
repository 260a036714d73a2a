"""Global rate limits on real workers: one limit across workers, no attempt burned, no pool
slot held while waiting, and a 429's Retry-After pausing every worker."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, runs

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def rate_app(worker_env: dict[str, str]) -> Any:
    from tests.support import rate_app

    return rate_app


@pytest.fixture(scope="module")
def two_workers(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, rate_app: Any
) -> Iterator[list[WorkerProcess]]:
    log_dir = tmp_path_factory.mktemp("rate")
    procs = [
        WorkerProcess(
            "tests.support.rate_app",
            ["fast"],
            env=worker_env,
            cwd=str(ROOT),
            log_dir=str(log_dir),
            concurrency=2,
        )
        for _ in range(2)
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


def max_in_any_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


def test_the_limit_holds_across_two_workers_without_burning_attempts_or_slots(
    rate_app: Any, two_workers: list[WorkerProcess], redis_client: redis.Redis
) -> None:
    key, other_key = f"burst-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    for _ in range(50):
        rate_app.call_partner.delay(key)
    # Another task on the same queue, sent behind the burst, runs long before the burst is
    # through (50 at 5/s take ~10 s): waiting jobs hold no pool slot and no prefetch.
    rate_app.other.delay(other_key)
    wait_for(lambda: runs(redis_client, other_key), timeout_s=5, message="the other task")
    assert len(runs(redis_client, key)) < 40, "the limited burst should still be running"

    wait_for(lambda: len(runs(redis_client, key)) >= 50, timeout_s=60, message="50 starts")
    records = runs(redis_client, key)
    assert len(records) == 50  # each job ran once
    starts = [r["t"] for r in records]
    assert max_in_any_window(starts, 1.0) <= 5 + 1
    assert {r["retries"] for r in records} == {0}  # deferring is not an attempt
    assert {r["errors"] for r in records} == {0}
    assert len({r["host"] for r in records}) == 2  # both workers took part
    rate = (len(starts) - 1) / (max(starts) - min(starts))
    assert rate <= 5.5


def deferred(app: Any, key: str) -> float:
    """``jobs_rate_deferred_total{key}``, the fleet's total as the exporter serves it."""
    from jobs_platform.exporter.server import exposition

    for line in exposition(app).splitlines():
        if line.startswith(f'jobs_rate_deferred_total{{key="{key}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def settled(read: Any, *, quiet_s: float, timeout_s: float) -> float:
    """``read()`` once it has not changed for ``quiet_s`` (polled, with a deadline)."""
    deadline = time.monotonic() + timeout_s
    value, since = read(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise TimeoutError(f"still changing after {timeout_s:g} s (last {value})")
        time.sleep(0.2)
        now = read()
        if now != value:
            value, since = now, time.monotonic()
    return float(value)


def test_a_burst_over_the_limit_is_deferred_about_once_per_job(
    rate_app: Any, two_workers: list[WorkerProcess], redis_client: redis.Redis
) -> None:
    """Each deferred job reserves its own slot (jobs_platform.ratelimit): 40 jobs at 5/s on
    two workers, at most 1.5 deferrals per job on average (79 at 5/s made 835 before)."""
    name = rate_app.call_partner.name  # the task's own rate key
    before = deferred(rate_app.app, name)
    key = f"churn-{uuid.uuid4().hex[:6]}"
    rate_app.call_partner.delay_many([(key,)] * 40)
    wait_for(lambda: len(runs(redis_client, key)) >= 40, timeout_s=60, message="40 starts")
    # The workers flush their counts every JOBS_METRICS_FLUSH_INTERVAL (2 s).
    wait_for(
        lambda: deferred(rate_app.app, name) - before >= 39,
        timeout_s=15,
        message="the deferrals counted",
    )
    # Read the total once no worker has flushed a new count for 2.5 flush intervals, so
    # that a late flush cannot hide deferrals from the bound below.
    total = settled(lambda: deferred(rate_app.app, name) - before, quiet_s=5.0, timeout_s=40)
    records = runs(redis_client, key)
    starts = [r["t"] for r in records]
    per_job = total / 40
    print(
        f"\n40 jobs at 5/s: {total:g} deferrals ({per_job:.2f} per job), at most "
        f"{max_in_any_window(starts, 1.0)} starts in a 1-s window"
    )
    assert len(records) == 40 and {r["retries"] for r in records} == {0}
    assert per_job <= 1.5
    assert max_in_any_window(starts, 1.0) <= 5 + 1


def test_a_429_with_retry_after_pauses_the_key_for_every_worker(
    rate_app: Any, two_workers: list[WorkerProcess], redis_client: redis.Redis
) -> None:
    busy, same = f"busy-{uuid.uuid4().hex[:6]}", f"same-{uuid.uuid4().hex[:6]}"
    rate_app.busy_partner.delay(busy)
    first = wait_for(lambda: runs(redis_client, busy), timeout_s=10, message="the 429")[0]
    # Wait until the pause is in force, then call the same partner through another task.
    wait_for(
        lambda: redis_client.pttl("jobs:rate:partner-api:paused") > 0,
        timeout_s=5,
        message="the pause",
    )
    rate_app.same_partner.delay(same)
    [other] = wait_for(lambda: runs(redis_client, same), timeout_s=15, message="same partner")
    assert other["t"] - first["t"] >= 1.5  # held back by the 2 s Retry-After
    assert other["retries"] == 0
    retried = wait_for(
        lambda: len(runs(redis_client, busy)) >= 2 and runs(redis_client, busy),
        timeout_s=15,
        message="the retried call",
    )
    assert retried[1]["t"] - first["t"] >= 1.5


def test_a_bad_rate_is_refused_at_declaration(rate_app: Any) -> None:
    from jobs_platform import ConfigError, ReliableTask

    with pytest.raises(ConfigError, match="rate_limit must look like '10/s'"):

        @rate_app.app.task(base=ReliableTask, queue="fast", rate_limit="fast please")
        def bad() -> None: ...
