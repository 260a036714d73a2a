"""bench.outbox's worker app: one task that records, on its start, how long after its
producer's call it began (both on this machine's clock), for the latency figures."""

from __future__ import annotations

import os
import time
from typing import Any

import redis

from bench.apps._marks import broker_url
from jobs_platform import ReliableTask, create_app

LATENCIES_KEY = "bench:outbox:latency:{variant}"

app = create_app(
    "bench_outbox",
    broker_url=broker_url(),
    database_url=os.environ.get("JOBS_DATABASE_URL", "sqlite:///bench-outbox.sqlite3"),
)
_client: redis.Redis | None = None


@app.task(base=ReliableTask, name="bench.outbox.touch", queue="fast", ignore_result=True)
def touch(variant: str, called_at: float) -> None:
    global _client
    started = time.time()
    if _client is None:
        _client = redis.Redis.from_url(broker_url())
    _client.rpush(LATENCIES_KEY.format(variant=variant), started - called_at)


def producer(url: str, database_url: str) -> Any:
    """The same task on a producer's app (the benchmark's own process)."""
    made = create_app("bench_outbox", broker_url=url, database_url=database_url)

    @made.task(base=ReliableTask, name="bench.outbox.touch", queue="fast", ignore_result=True)
    def touch(variant: str, called_at: float) -> None: ...

    return touch
