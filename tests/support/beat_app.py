"""An app with recurring entries, for the beat tests (tests/integration/redis/test_schedule*.py,
tests/acceptance/test_beat*.py).

The schedule comes from ``JPTEST_BEAT_ENTRIES`` (JSON: name -> ``{"task", "every" (seconds),
"args", "options"}``), so every test runs real ``celery beat`` processes over entries of its
own. Each run records itself in ``jptest:beat:<key>`` with the slot it was sent for.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from typing import Any

from jobs_platform import ReliableTask, create_app, schedule
from jobs_platform.history import ENQUEUED_HEADER
from tests.support.recording import client

ENTRIES_ENV = "JPTEST_BEAT_ENTRIES"

app = create_app("beatapp")


def run_record(task: Any, **extra: Any) -> dict[str, Any]:
    headers = task.request.headers or {}
    return {
        "slot": headers.get(schedule.SLOT_HEADER),
        "entry": headers.get(schedule.ENTRY_HEADER),
        "enqueued": headers.get(ENQUEUED_HEADER),
        "task_id": task.request.id,
        "host": task.request.hostname,
        **extra,
    }


@app.task(base=ReliableTask, bind=True, name="beat.record_slot", queue="fast", time_limit=10)
def record_slot(self: Any, key: str) -> None:
    client().rpush(f"jptest:beat:{key}", json.dumps(run_record(self, started=time.time())))


@app.task(base=ReliableTask, bind=True, name="beat.slow", queue="fast", time_limit=20)
def slow(self: Any, key: str, seconds: float) -> None:
    started = time.time()
    time.sleep(seconds)
    client().rpush(
        f"jptest:beat:{key}", json.dumps(run_record(self, started=started, ended=time.time()))
    )


def entries_from_env() -> dict[str, dict[str, Any]]:
    raw = json.loads(os.environ.get(ENTRIES_ENV) or "{}")
    return {
        name: {
            "task": spec["task"],
            "schedule": dt.timedelta(seconds=float(spec["every"])),
            "args": tuple(spec.get("args", ())),
            "options": dict(spec.get("options", {})),
        }
        for name, spec in raw.items()
    }


app.conf.beat_schedule = entries_from_env()
