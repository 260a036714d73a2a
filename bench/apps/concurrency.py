"""The per-key concurrency benchmark's apps (``bench/concurrency.py``): one short task.

``BENCH_CONC_VARIANT`` picks the variant a worker runs; the orchestrator builds the same
app to publish. The task records when its body starts (``BENCH_MARKS_URL``, list
``conc:starts``) and sleeps :data:`BODY_S`.

* ``celery``: bare Celery, no limit;
* ``reliable``: ``ReliableTask``, no limit;
* ``keyed16``: ``ReliableTask`` with ``concurrency_key`` over 16 keys, limit 1 each (more
  keys than pool processes: the limit seldom binds, so this is its cost);
* ``keyed1``: one key, limit 1: the jobs run one at a time across the fleet.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from bench.apps._marks import broker_url

STARTS = "conc:starts"
VARIANTS = ("celery", "reliable", "keyed16", "keyed1")
BODY_S = 0.02

_client: tuple[int, redis.Redis] | None = None


def _record() -> None:
    global _client
    if _client is None or _client[0] != os.getpid():  # one client per (forked) process
        _client = (os.getpid(), redis.Redis.from_url(os.environ["BENCH_MARKS_URL"]))
    _client[1].rpush(STARTS, time.time())
    time.sleep(BODY_S)


def make_app(url: str, variant: str) -> tuple[Any, Any, str]:
    """(app, the task, its queue) for ``variant``."""
    if variant == "celery":
        app = Celery("bench_conc_celery", broker=url, set_as_current=False)

        @app.task(name="bench.conc.work", ignore_result=True)
        def plain_work(n: int) -> None:
            _record()

        return app, plain_work, "celery"
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: {', '.join(VARIANTS)}")
    from jobs_platform import ReliableTask, create_app

    app = create_app(f"bench_conc_{variant}", broker_url=url)
    keys = {"keyed16": 16, "keyed1": 1}.get(variant)
    declared: dict[str, Any] = {}
    if keys is not None:
        declared["concurrency_key"] = lambda n: f"bench-{n % keys}"

    @app.task(base=ReliableTask, name="bench.conc.work", queue="fast", **declared)
    def work(n: int) -> None:
        _record()

    return app, work, "fast"


app, TASK, QUEUE = make_app(broker_url(), os.environ.get("BENCH_CONC_VARIANT", "celery"))
