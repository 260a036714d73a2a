"""The fairness benchmark's apps (``bench/fairness.py``): one short task.

``BENCH_FAIR_VARIANT`` picks the variant a worker runs; the orchestrator builds the same
app to publish. The task records when its body starts (``BENCH_MARKS_URL``, list
``fair:starts``) and sleeps :data:`BODY_S`.

* ``celery``: bare Celery;
* ``reliable``: ``ReliableTask`` without a fairness key (every fetch still looks at the
  queue's empty ring);
* ``fair16`` / ``fair1000``: ``fairness_key`` over 16 / 1000 tenants, every job keyed.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from bench.apps._marks import broker_url

STARTS = "fair:starts"
VARIANTS = ("celery", "reliable", "fair16", "fair1000")
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
        app = Celery("bench_fair_celery", broker=url, set_as_current=False)

        @app.task(name="bench.fair.work", ignore_result=True)
        def plain_work(n: int) -> None:
            _record()

        return app, plain_work, "celery"
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: {', '.join(VARIANTS)}")
    from jobs_platform import ReliableTask, create_app

    app = create_app(f"bench_fair_{variant}", broker_url=url)
    keys = {"fair16": 16, "fair1000": 1000}.get(variant)
    declared: dict[str, Any] = {}
    if keys is not None:
        declared["fairness_key"] = lambda n: f"tenant-{n % keys}"

    @app.task(base=ReliableTask, name="bench.fair.work", queue="fast", **declared)
    def work(n: int) -> None:
        _record()

    return app, work, "fast"


app, TASK, QUEUE = make_app(broker_url(), os.environ.get("BENCH_FAIR_VARIANT", "celery"))
