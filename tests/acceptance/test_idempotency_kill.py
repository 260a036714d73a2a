"""SIGKILL after the gateway charged, before ``paid`` and the ack: still exactly one charge.

This is the window the status CAS cannot close on its own: the claimant is gone, its
claim stays until the lease (the task's hard limit, 24 s) runs out, the broker hands the
message to another worker after the visibility timeout (30 s), that worker re-claims the
row and calls the gateway again, with the same idempotency key, so the gateway answers
with the first charge instead of charging twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.testing import wait_for
from tasks.gateway import GatewayServer
from tests.acceptance.test_idempotency import (
    bapp,
    billing_env,
    billing_worker,
    charge_requests,
    charges,
    gateway,
    invoice,
    new_invoice,
    wait_receipt,
)

pytestmark = pytest.mark.acceptance
__all__ = ["bapp", "billing_env", "gateway"]  # module fixtures reused from the sibling module


def test_sigkill_after_the_gateway_call_is_redelivered_and_charges_once(
    bapp: Any,
    billing_env: dict[str, str],
    gateway: GatewayServer,
    pg_url: str,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    invoice_id = new_invoice(pg_url)
    # The delivery SIGKILLs its own worker right after the gateway call: the crash lands in
    # the window by construction, not by the test winning a race against a timer.
    redis_client.set(f"jptest:kill-worker-after-charge:{invoice_id}", 1)
    first = billing_worker(billing_env, tmp_path, "doomed").start()
    try:
        result = bapp.charge_invoice.delay(invoice_id)
        wait_for(lambda: not first.alive, timeout_s=60, message="the worker to kill itself")
    finally:
        first.stop()
    assert len(charges(gateway, invoice_id)) == 1  # the gateway charged before the kill
    assert invoice(pg_url, invoice_id)["status"] == "charging"  # the crash window

    with billing_worker(billing_env, tmp_path, "rescuer"):
        wait_for(
            lambda: invoice(pg_url, invoice_id)["status"] == "paid",
            timeout_s=120,  # the visibility timeout (30 s) first, on a loaded machine
            interval_s=0.2,
            message="the redelivered charge to complete",
        )
        assert result.get(timeout=30) == charges(gateway, invoice_id)[0]
        receipt = wait_receipt(gateway, invoice_id)

    assert len(charges(gateway, invoice_id)) == 1
    # Two calls reached the gateway; the second carried the same key and was answered with
    # the first charge (200, replayed) instead of a new one (201).
    assert charge_requests(gateway, invoice_id) == [201, 200]
    assert invoice(pg_url, invoice_id)["charge_id"] == charges(gateway, invoice_id)[0]["id"]
    assert len(receipt) == 1
