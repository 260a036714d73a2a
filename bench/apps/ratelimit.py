"""The rate-limit benchmark's apps (``bench/ratelimit.py``): one task limited to 5/s.

``BENCH_RATE_VARIANT`` picks the variant a worker runs; the orchestrator builds the same app
to publish. The task records when its body starts (``BENCH_MARKS_URL``, list
``rate:starts``), so the starts per second are what a rate-limited partner would see.

* ``celery``: bare Celery, ``rate_limit="5/s"``: a token bucket in each worker process's
  consumer, so two workers start up to 10 a second between them.
* ``reliable``: ``ReliableTask`` on ``create_app``, ``rate_limit="5/s"``: one limit for the
  whole fleet (``jobs_platform.ratelimit``), a job over it deferred to the slot it reserved.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from bench.apps._marks import broker_url

RATE = "5/s"
STARTS = "rate:starts"
VARIANTS = ("celery", "reliable")

_client: tuple[int, redis.Redis] | None = None


def _record() -> None:
    global _client
    if _client is None or _client[0] != os.getpid():  # one client per (forked) process
        _client = (os.getpid(), redis.Redis.from_url(os.environ["BENCH_MARKS_URL"]))
    _client[1].rpush(STARTS, time.time())


def make_app(url: str, variant: str) -> tuple[Any, Any, str]:
    """(app, the limited task, its queue) for ``variant``."""
    if variant == "reliable":
        from jobs_platform import ReliableTask, create_app

        app = create_app("bench_rate_reliable", broker_url=url)

        @app.task(base=ReliableTask, name="bench.rate.hit", queue="fast", rate_limit=RATE)
        def hit(n: int) -> None:
            _record()

        return app, hit, "fast"
    if variant != "celery":
        raise SystemExit(f"unknown variant {variant!r}: {', '.join(VARIANTS)}")
    app = Celery("bench_rate_celery", broker=url, set_as_current=False)

    @app.task(name="bench.rate.hit", rate_limit=RATE, ignore_result=True)
    def plain_hit(n: int) -> None:
        _record()

    return app, plain_hit, "celery"


app, TASK, QUEUE = make_app(broker_url(), os.environ.get("BENCH_RATE_VARIANT", "celery"))
