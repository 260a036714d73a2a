"""Timestamps recorded by a few marked tasks: the first K of a round at body start, the
last K at body end. Unmarked tasks (all the others) do nothing extra, so the measurement
adds no Redis round trip to the tasks whose rate is measured.

A task marked ``...:gate`` blocks until the benchmark pushes a token to that key: one per
pool process holds a worker still while a round is published (``bench.brokers``: RabbitMQ
has no atomic MOVE to fill a queue behind a worker's back).
"""

from __future__ import annotations

import os
import threading
import time

import redis

NO_BROKER = "redis://127.0.0.1:1/0"  # closed port: a worker started by hand fails loudly
START, END, GATE = "start", "end", "gate"
GATE_TIMEOUT_S = 300

_lock = threading.Lock()
_client: tuple[int, redis.Redis] | None = None


def _redis() -> redis.Redis:
    global _client
    with _lock:
        if _client is None or _client[0] != os.getpid():  # one client per (forked) process
            _client = (os.getpid(), redis.Redis.from_url(os.environ["BENCH_MARKS_URL"]))
        return _client[1]


def broker_url() -> str:
    return os.environ.get("BENCH_BROKER_URL", NO_BROKER)


def body(mark: str | None, sleep_s: float) -> None:
    """The benchmark task body: optionally record, optionally sleep (short I/O)."""
    if mark is not None and mark.endswith(":" + GATE):
        _redis().rpush(f"{mark}:held", os.getpid())  # this process is held
        _redis().blpop([mark], timeout=GATE_TIMEOUT_S)
        return
    if mark is not None and mark.endswith(":" + START):
        _redis().rpush(mark, time.time())
    if sleep_s:
        time.sleep(sleep_s)
    if mark is not None and mark.endswith(":" + END):
        _redis().rpush(mark, time.time())
