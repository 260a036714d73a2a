"""thirdparty queue: push an account to a partner's HTTP API.

Connection blips are retried in-process (tenacity, a few hundred ms); anything the
partner says with a status code goes to the task's classifier: 429/5xx (with
Retry-After) are retried through the broker with backoff, other 4xx fail at once.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from jobs_platform import ReliableTask
from jobs_platform.retry.inprocess import quick_retry
from tasks.jobs import app


def partner_url() -> str:
    return os.environ.get("JOBS_PARTNER_URL", "http://127.0.0.1:8765")


class PartnerHTTPError(Exception):
    """The partner answered with an error status.

    ``status_code`` and ``headers`` (``Retry-After``) are what the platform's classifier
    reads; the message alone survives the JSON result backend, so it says everything.
    """

    def __init__(
        self, message: str, status_code: int | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.headers = headers or {}


def post_json(url: str, payload: dict[str, Any], *, timeout_s: float = 10.0) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        for attempt in quick_retry():
            with attempt, urllib.request.urlopen(request, timeout=timeout_s) as response:
                return dict(json.loads(response.read() or b"{}"))
    except urllib.error.HTTPError as exc:
        raise PartnerHTTPError(
            f"partner answered HTTP {exc.code} for {url}", exc.code, dict(exc.headers.items())
        ) from None
    raise AssertionError("unreachable: quick_retry re-raises")  # pragma: no cover


@app.task(
    base=ReliableTask,
    bind=True,
    name="tasks.partner.sync_account",
    queue="thirdparty",
    max_retries=4,
)
def sync_account(self: Any, account_id: int) -> dict[str, Any]:
    return post_json(f"{partner_url()}/accounts/{account_id}", {"account_id": account_id})
