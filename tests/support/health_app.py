"""The app the health tests check (``celery -A tests.support.health_app health ...``).

Broker and database come from ``JOBS_BROKER_URL`` / ``JOBS_DATABASE_URL``.
``JPTEST_HEALTH_BEAT=<seconds>`` gives it a beat schedule with one entry at that interval
(the beat check is skipped without one). ``health.sleep`` keeps a pool slot busy.
"""

from __future__ import annotations

import os
import time

from jobs_platform import ReliableTask, create_app

app = create_app("healthapp")

if os.environ.get("JPTEST_HEALTH_BEAT"):
    app.conf.beat_schedule = {
        "tick": {"task": "health.noop", "schedule": float(os.environ["JPTEST_HEALTH_BEAT"])}
    }


@app.task(base=ReliableTask, name="health.noop", queue="fast")
def noop() -> None:
    return None


@app.task(base=ReliableTask, name="health.sleep", queue="heavy", max_retries=0)
def sleep(seconds: float, marker: str = "") -> None:
    if marker:
        import redis

        redis.Redis.from_url(app.conf.broker_url).set(marker, "1", ex=60)
    time.sleep(seconds)
