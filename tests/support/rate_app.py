"""Tasks under a shared rate limit, for tests/acceptance/test_rate_limit.py."""

from __future__ import annotations

import email.message
import urllib.error
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.recording import client, record

app = create_app("rateapp", retry_backoff=0.2, retry_backoff_max=1.0)


@app.task(base=ReliableTask, bind=True, name="rate.call_partner", queue="fast", rate_limit="5/s")
def call_partner(self: Any, key: str) -> None:
    record(self, key)


@app.task(base=ReliableTask, bind=True, name="rate.other", queue="fast")
def other(self: Any, key: str) -> None:
    record(self, key)


@app.task(
    base=ReliableTask,
    bind=True,
    name="rate.busy_partner",
    queue="fast",
    rate_key="partner-api",
    max_retries=3,
)
def busy_partner(self: Any, key: str) -> None:
    """Answers 429 with Retry-After: 2 on its first run, then succeeds."""
    if record(self, key) == 1:
        headers = email.message.Message()
        headers["Retry-After"] = "2"
        raise urllib.error.HTTPError("http://127.0.0.1/partner", 429, "slow down", headers, None)


@app.task(
    base=ReliableTask, bind=True, name="rate.same_partner", queue="fast", rate_key="partner-api"
)
def same_partner(self: Any, key: str) -> None:
    record(self, key)


def runs_of(key: str) -> int:
    return int(client().llen(f"jptest:runs:{key}"))
