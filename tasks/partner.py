"""thirdparty queue: push an account to a partner's HTTP API; book an order's shipment
with the shipping partner, behind a circuit breaker.

Connection blips are retried in-process (tenacity, a few hundred ms); anything the
partner says with a status code goes to the task's classifier: 429/5xx (with
Retry-After) are retried through the broker with backoff, other 4xx fail at once.

``book_shipment`` names its downstream (``rate_key="shipping-partner"``) and gives it a
circuit breaker (docs/flow-control.md#circuit-breaker): when the partner is down, three
failures in a row open it, and the jobs wait (deferred: no attempt spent, no dead letter)
until one probe finds the partner back. The options are the demo's (a 2-second cool-down
shows an outage in a few seconds); a real partner would keep the defaults (5, 60 s, 30 s).
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


def post_json(
    url: str,
    payload: dict[str, Any],
    *,
    timeout_s: float = 10.0,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
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


#: The shipping partner, as the breaker (and a rate limit, if one were declared) knows it.
SHIPPING_PARTNER = "shipping-partner"


@app.task(
    base=ReliableTask,
    bind=True,
    name="tasks.partner.book_shipment",
    queue="thirdparty",
    max_retries=4,
    rate_key=SHIPPING_PARTNER,
    breaker_threshold=3,
    breaker_window=10,
    breaker_cooldown=2,
)
def book_shipment(self: Any, order_id: int) -> dict[str, Any]:
    # The job's id as the Idempotency-Key: a retried call books the same shipment.
    return post_json(
        f"{partner_url()}/shipments/{order_id}",
        {"order_id": order_id},
        headers={"Idempotency-Key": str(self.request.id)},
    )
