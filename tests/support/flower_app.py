"""The app Flower and two workers load in the Flower acceptance tests.

Everything comes from the environment (the test session's Redis DB, Flower's state file and
credentials), exactly as ``celery -A tests.support.flower_app flower`` reads it in production.
``flower.hold`` keeps a worker busy until the Redis key ``jptest:release:<key>`` exists
(or ``max_s`` passes), so a test decides when the busy worker becomes idle.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from jobs_platform import ReliableTask, create_app

app = create_app("flowerapp")
_redis = redis.Redis.from_url(app.conf.broker_url)


@app.task(base=ReliableTask, name="flower.invoice", queue="fast")
def invoice(customer: str, amount_cents: int, *, currency: str = "EUR") -> str:
    return f"invoiced {customer} {amount_cents} {currency}"


@app.task(base=ReliableTask, name="flower.hold", queue="heavy")
def hold(key: str, max_s: float = 120.0) -> str:
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline:
        if _redis.exists(f"jptest:release:{key}"):
            return "released"
        time.sleep(0.05)
    return "gave up"


def release(key: str, client: Any) -> None:
    client.set(f"jptest:release:{key}", 1, ex=600)
