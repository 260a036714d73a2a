"""bench.batches's worker app: a no-op member that counts its runs, and a callback."""

from __future__ import annotations

import os
from typing import Any

import redis

from bench.apps._marks import broker_url
from jobs_platform import ReliableTask, create_app

RUNS_KEY = "bench:batches:runs"


def make(url: str | None = None, database_url: str | None = None) -> Any:
    made = create_app(
        "bench_batches",
        broker_url=url or broker_url(),
        database_url=database_url or os.environ.get("JOBS_DATABASE_URL", "sqlite:///b.sqlite3"),
    )
    client: list[redis.Redis] = []

    @made.task(base=ReliableTask, name="bench.batches.noop", queue="fast", ignore_result=True)
    def noop(i: int) -> None:
        if not client:
            client.append(redis.Redis.from_url(made.conf.broker_url))
        client[0].incr(RUNS_KEY)

    @made.task(base=ReliableTask, name="bench.batches.done", queue="fast", ignore_result=True)
    def done(batch_id: str) -> None: ...

    return made


app = make()
