"""Chunks, a callback and chain steps for the canvas tests (chord, chain under dead letters).

A chunk whose index is in ``jptest:poison:<key>`` fails with a PermanentError; every run of
a chunk is counted in ``jptest:chunkruns:<key>`` and of the callback in
``jptest:callback:<key>``.
"""

from __future__ import annotations

from jobs_platform import ReliableTask, create_app
from jobs_platform.errors import PermanentError
from tests.support.recording import client

app = create_app("canvas", retry_backoff=0.2, retry_backoff_max=0.5)


@app.task(base=ReliableTask, name="canvas.chunk", queue="fast", max_retries=2)
def chunk(key: str, index: int) -> int:
    redis = client()
    redis.hincrby(f"jptest:chunkruns:{key}", str(index), 1)
    if redis.sismember(f"jptest:poison:{key}", index):
        raise PermanentError(f"chunk {index} holds a poison row")
    return index


@app.task(base=ReliableTask, name="canvas.total", queue="fast", max_retries=2)
def total(results: list[int], key: str) -> int:
    client().incr(f"jptest:callback:{key}")
    return sum(results)


@app.task(base=ReliableTask, name="canvas.step", queue="fast", max_retries=2)
def step(value: int, key: str) -> int:
    redis = client()
    redis.incr(f"jptest:steps:{key}")
    if redis.sismember(f"jptest:poison:{key}", value):
        raise PermanentError(f"step got poison value {value}")
    return value + 1
