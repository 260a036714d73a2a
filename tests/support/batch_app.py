"""Tasks for the batch acceptance tests (tests/acceptance/test_batches.py).

Workers run ``-A tests.support.batch_app`` with ``JOBS_BROKER_URL`` and ``JOBS_DATABASE_URL``
set to the test's own; the coordination Redis (the broker's) records runs and callbacks:

- ``batch:runs`` (hash member n -> runs), ``batch:starts`` (list of n, in order of start);
- ``batch:poison`` (set of n that fail permanently until removed: "fixed");
- ``batch:callbacks`` (list of "<callback>:<batch id>");
- ``batch:doomed`` (hash "<kind><n>" -> runs of ``batch.killer`` / ``batch.hung``).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis
from celery.exceptions import SoftTimeLimitExceeded

from jobs_platform import PermanentError, ReliableTask, TransientError, create_app

app = create_app(
    "batchapp",
    visibility_timeout=8.0,
    visibility_margin=2.0,
    unacked_restore_interval=1.0,
    worker_lease=3.0,
    retry_backoff=0.1,
    retry_backoff_max=0.3,
)


def client(task: Any) -> redis.Redis:
    return redis.Redis.from_url(task.app.conf.broker_url)


@app.task(base=ReliableTask, bind=True, name="batch.member", queue="fast", max_retries=3)
def member(self: Any, n: int, transient_every: int = 0) -> int:
    """A no-op member: transient on its first attempt for n % transient_every == 0,
    permanent while n is in batch:poison."""
    r = client(self)
    runs = r.hincrby("batch:runs", str(n), 1)
    if r.sismember("batch:poison", str(n)):
        raise PermanentError(f"row {n} is poison")
    if transient_every and n % transient_every == 0 and runs == 1:
        raise TransientError(f"row {n}: first attempt fails")
    return n


@app.task(base=ReliableTask, bind=True, name="batch.slow", queue="fast", max_retries=1)
def slow(self: Any, n: int) -> int:
    client(self).rpush("batch:starts", str(n))
    time.sleep(0.1)
    return n


@app.task(base=ReliableTask, bind=True, name="batch.spawner", queue="fast", max_retries=3)
def spawner(self: Any, n: int, children: int) -> int:
    """Adds ``children`` members, then fails its first attempt: the re-run adds them again,
    which must count once."""
    self.batch.add([member.s(1000 * (n + 1) + i) for i in range(children)])
    if client(self).hincrby("batch:spawns", str(n), 1) == 1:
        raise TransientError("first attempt fails after adding")
    return n


@app.task(base=ReliableTask, bind=True, name="batch.killer", queue="fast", max_retries=1)
def killer(self: Any, n: int) -> None:
    """SIGKILLs its pool process every run: after max_retries, the main process dead-letters
    it (worker_lost)."""
    client(self).hincrby("batch:doomed", f"killer{n}", 1)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(
    base=ReliableTask,
    bind=True,
    name="batch.hung",
    queue="fast",
    time_limit=1.0,
    soft_time_limit=0.5,
)
def hung(self: Any, n: int) -> None:
    """Ignores its soft limit: the main process kills it at the hard one (time_limit)."""
    client(self).hincrby("batch:doomed", f"hung{n}", 1)
    try:
        time.sleep(10)
    except SoftTimeLimitExceeded:
        time.sleep(10)


@app.task(base=ReliableTask, bind=True, name="batch.callback", queue="fast")
def callback(self: Any, batch_id: str, kind: str) -> None:
    client(self).rpush("batch:callbacks", f"{kind}:{batch_id}")
