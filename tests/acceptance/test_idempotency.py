"""At-least-once delivery never repeats a side effect: real workers, PostgreSQL, Redis, HTTP.

Two prefork workers (one slot each) run the reference billing tasks against a payment
gateway on loopback that records every charge request. Duplicates are made the ways they
happen in production: two deliveries racing, a replay of a finished job, a retry after a
transient error, a crashed claimant's expired lease, a burst of identical dispatches.
(The SIGKILL case is in test_idempotency_kill.py: it needs workers of its own.)
"""

from __future__ import annotations

import datetime as dt
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from jobs_platform.db import engine_for, upgrade
from jobs_platform.deadletter import DeadLetterStore
from jobs_platform.deadletter.replay import replay
from jobs_platform.testing import WorkerProcess, wait_for, workers
from tasks import billing
from tasks.gateway import GatewayServer

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
CHARGE = "tasks.billing.charge_invoice"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    with GatewayServer() as server:
        yield server


@pytest.fixture(scope="module")
def billing_env(redis_url: str, pg_url: str, gateway: GatewayServer) -> dict[str, str]:
    upgrade(pg_url)
    billing.create_schema(engine_for(pg_url))
    os.environ["JOBS_BROKER_URL"] = redis_url  # the test process dispatches to the same DB
    return {
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": pg_url,
        "BILLING_GATEWAY_URL": gateway.url,
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture(scope="module")
def bapp(billing_env: dict[str, str]) -> Any:
    from tests.support import billing_app

    return billing_app


def billing_worker(env: dict[str, str], tmp: Path, name: str) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.billing_app",
        ["thirdparty", "fast"],
        env=env,
        cwd=str(ROOT),
        log_dir=str(tmp),
        concurrency=1,
        hostname=f"{name}-{uuid.uuid4().hex[:6]}@billing",
    )


@pytest.fixture(scope="module")
def two_workers(
    bapp: Any, billing_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[WorkerProcess, ...]]:
    tmp = tmp_path_factory.mktemp("billing-workers")
    with workers(billing_worker(billing_env, tmp, "a"), billing_worker(billing_env, tmp, "b")) as w:
        wait_pools_ready(bapp, billing_env["JOBS_BROKER_URL"], w)
        yield w


# -- helpers ------------------------------------------------------------------------------------


def log_tails(procs: tuple[WorkerProcess, ...], chars: int = 1500) -> str:
    return "\n".join(f"--- {p.hostname}:\n{p.log()[-chars:]}" for p in procs)


def wait_pools_ready(bapp: Any, url: str, procs: tuple[WorkerProcess, ...]) -> None:
    """Wait until every worker's pool process has finished its start-up, not only its main
    process: a worker whose pool process hangs there takes one job and never runs it, and
    every race below would then be lost to the other worker (billing_app's module doc)."""
    client = redis.Redis.from_url(url)
    try:

        def not_ready() -> list[str]:
            return [
                p.hostname
                for p in procs
                if not client.exists(bapp.POOL_READY_KEY.format(hostname=p.hostname))
            ]

        wait_for(
            lambda: not not_ready(),
            timeout_s=60,
            message=lambda: f"the pool process of {not_ready()} to start\n{log_tails(procs)}",
        )
    finally:
        client.close()


def new_invoice(pg_url: str, **values: Any) -> int:
    engine = engine_for(pg_url)
    invoice_id = billing.create_invoice(engine, customer_email="ada@example.com", amount_cents=4200)
    if values:
        with engine.begin() as conn:
            conn.execute(
                sa.update(billing.invoices)
                .where(billing.invoices.c.id == invoice_id)
                .values(**values)
            )
    return invoice_id


def invoice(pg_url: str, invoice_id: int) -> dict[str, Any]:
    row = billing.load_invoice(engine_for(pg_url), invoice_id)
    assert row is not None
    return row


def charges(gateway: GatewayServer, invoice_id: int) -> list[dict[str, Any]]:
    return [c for c in list(gateway.charges) if c["reference"] == f"invoice-{invoice_id}"]


def charge_requests(gateway: GatewayServer, invoice_id: int) -> list[int]:
    key = f"{CHARGE}:invoice_id={invoice_id}"
    return [r["status"] for r in list(gateway.requests) if r["key"] == key]


def receipts(gateway: GatewayServer, invoice_id: int) -> list[dict[str, Any]]:
    return [e for e in list(gateway.emails) if e["subject"].endswith(f" {invoice_id}")]


def race_at_the_barrier(
    redis_client: redis.Redis, invoice_id: int, workers: tuple[WorkerProcess, ...]
) -> None:
    """Wait until both deliveries wait at the claim, assert they are on different workers,
    then let them claim together (the workers wait for this signal, not for a timer)."""
    arrived_key = f"jptest:barrier:{invoice_id}:arrived"
    arrived = wait_for(
        lambda: (lambda names: names if len(names) >= 2 else None)(
            redis_client.lrange(arrived_key, 0, -1)
        ),
        timeout_s=30,
        message=lambda: (
            f"two deliveries at the barrier (so far: {redis_client.lrange(arrived_key, 0, -1)})"
            f"\n{log_tails(workers)}"
        ),
    )
    # Asserted, not assumed: each worker runs one slot, so a real race needs both.
    assert sorted(arrived) == sorted(w.hostname for w in workers), log_tails(workers)
    redis_client.set(f"jptest:barrier:{invoice_id}:go", 1)


def wait_receipt(gateway: GatewayServer, invoice_id: int) -> list[dict[str, Any]]:
    return wait_for(
        lambda: receipts(gateway, invoice_id),
        timeout_s=30,
        message=f"the receipt of invoice {invoice_id}",
    )


# -- the proofs ---------------------------------------------------------------------------------


def test_two_workers_racing_on_the_same_charge_charge_once(
    bapp: Any, two_workers: Any, gateway: GatewayServer, pg_url: str, redis_client: redis.Redis
) -> None:
    invoice_id = new_invoice(pg_url)
    redis_client.set(f"jptest:barrier:{invoice_id}", 1)  # both deliveries claim together
    # Two messages for one charge (send_task bypasses unique dispatch, like a replay).
    first = bapp.app.send_task(CHARGE, args=[invoice_id])
    second = bapp.app.send_task(CHARGE, args=[invoice_id])
    race_at_the_barrier(redis_client, invoice_id, two_workers)
    results = [first.get(timeout=30), second.get(timeout=30)]

    assert {first.worker, second.worker} == {w.hostname for w in two_workers}  # a real race
    assert sum(r is not None for r in results) == 1  # the loser returned without charging
    assert len(charges(gateway, invoice_id)) == 1
    assert charge_requests(gateway, invoice_id) == [201]  # the CAS stopped it before the call
    row = invoice(pg_url, invoice_id)
    assert (row["status"], row["charge_id"]) == ("paid", charges(gateway, invoice_id)[0]["id"])
    assert len(wait_receipt(gateway, invoice_id)) == 1


def test_replay_of_a_completed_charge_charges_nothing_and_sends_no_second_receipt(
    bapp: Any, two_workers: Any, gateway: GatewayServer, pg_url: str
) -> None:
    invoice_id = new_invoice(pg_url)
    charge = bapp.charge_invoice.delay(invoice_id).get(timeout=30)
    receipt = wait_receipt(gateway, invoice_id)[0]

    # The same job again: re-sent as a new message (a dead-letter replay), and dispatched
    # again once the first finished (its unique lock is gone, so this enqueues too).
    assert bapp.app.send_task(CHARGE, args=[invoice_id]).get(timeout=30) is None
    assert bapp.charge_invoice.delay(invoice_id).get(timeout=30) is None
    # The receipt task re-sent directly: the key table hands back the recorded send.
    again = bapp.app.send_task("tasks.billing.send_invoice_email", args=[invoice_id])
    assert again.get(timeout=30) == receipt

    assert charges(gateway, invoice_id) == [charge]
    assert charge_requests(gateway, invoice_id) == [201]
    assert receipts(gateway, invoice_id) == [receipt]


def test_transient_failure_before_the_side_effect_releases_the_claim_and_the_retry_charges_once(
    bapp: Any, two_workers: Any, gateway: GatewayServer, pg_url: str
) -> None:
    invoice_id = new_invoice(pg_url)
    gateway.fail_next_charges(1)  # 503, nothing charged: a failure before the side effect
    result = bapp.charge_invoice.delay(invoice_id)
    charge = result.get(timeout=30)

    assert charge is not None  # the retry found the claim released and charged
    assert charge_requests(gateway, invoice_id) == [503, 201]
    assert len(charges(gateway, invoice_id)) == 1
    assert invoice(pg_url, invoice_id)["status"] == "paid"


def test_pool_child_killed_after_the_side_effect_is_retried_and_charges_once(
    bapp: Any, two_workers: Any, gateway: GatewayServer, pg_url: str, redis_client: redis.Redis
) -> None:
    # The child dies holding the claim; Celery retries the job at once (worker lost). The
    # retry is the same job (same task id), so it takes over its own dead attempt's claim
    # instead of waiting for the lease, and calls again with the same idempotency key.
    invoice_id = new_invoice(pg_url)
    redis_client.set(f"jptest:kill-child-after-charge:{invoice_id}", 1)
    charge = bapp.charge_invoice.delay(invoice_id).get(timeout=30)

    assert charge == charges(gateway, invoice_id)[0]
    assert charge_requests(gateway, invoice_id) == [201, 200]
    assert invoice(pg_url, invoice_id)["status"] == "paid"


def test_dead_letter_replay_after_the_side_effect_charges_nothing_more(
    bapp: Any, two_workers: Any, gateway: GatewayServer, pg_url: str, redis_client: redis.Redis
) -> None:
    # The gateway charged, then the job failed for good: the exception released the claim
    # (the task cannot know the charge went through) and the job went to the dead letters.
    invoice_id = new_invoice(pg_url)
    redis_client.set(f"jptest:fail-after-charge:{invoice_id}", 1)
    failed = bapp.charge_invoice.delay(invoice_id)
    store = DeadLetterStore(pg_url)  # where the workers record dead letters
    letter = wait_for(lambda: store.by_task_id(failed.id), timeout_s=30, message="the dead letter")[
        0
    ]
    assert invoice(pg_url, invoice_id)["status"] == "open"
    assert len(charges(gateway, invoice_id)) == 1

    new_id = replay(bapp.app, store, letter["id"], reason="bookkeeping fixed", actor="test")
    assert new_id is not None
    charge = bapp.app.AsyncResult(new_id).get(timeout=30)

    # The replay claimed and called again with the same key: the first charge came back.
    assert charge == charges(gateway, invoice_id)[0]
    assert charge_requests(gateway, invoice_id) == [201, 200]
    assert invoice(pg_url, invoice_id)["status"] == "paid"


def test_an_expired_lease_is_reclaimed_exactly_once_by_two_competing_workers(
    bapp: Any, two_workers: Any, gateway: GatewayServer, pg_url: str, redis_client: redis.Redis
) -> None:
    # A worker claimed the invoice and died: its lease ran out a second ago.
    invoice_id = new_invoice(
        pg_url,
        status="charging",
        claimed_by="crashed-worker",
        claim_expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1),
    )
    redis_client.set(f"jptest:barrier:{invoice_id}", 1)
    first = bapp.app.send_task(CHARGE, args=[invoice_id])
    second = bapp.app.send_task(CHARGE, args=[invoice_id])
    race_at_the_barrier(redis_client, invoice_id, two_workers)
    results = [first.get(timeout=30), second.get(timeout=30)]

    assert {first.worker, second.worker} == {w.hostname for w in two_workers}
    assert sum(r is not None for r in results) == 1
    assert len(charges(gateway, invoice_id)) == 1
    assert charge_requests(gateway, invoice_id) == [201]
    assert invoice(pg_url, invoice_id)["status"] == "paid"


def test_100_concurrent_dispatches_of_one_unique_key_make_one_job(
    bapp: Any, two_workers: Any, redis_client: redis.Redis
) -> None:
    key = uuid.uuid4().hex
    barrier = threading.Barrier(100)
    ids: list[str] = []
    lock = threading.Lock()

    def dispatch() -> None:
        barrier.wait()
        task_id = bapp.unique_gate.delay(key).id
        with lock:
            ids.append(task_id)

    threads = [threading.Thread(target=dispatch) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(ids) == 100 and len(set(ids)) == 1
    wait_for(lambda: redis_client.llen(f"jptest:runs:{key}"), timeout_s=30, message="the job")
    redis_client.set(f"jptest:gate:{key}", 1)
    assert bapp.app.AsyncResult(ids[0]).get(timeout=30) == key
    assert redis_client.lrange(f"jptest:runs:{key}", 0, -1) == [ids[0]]
    # The lock went with the finished job: the next dispatch is a new job.
    lock_key = f'jobs:unique:tests.unique_gate:key="{key}"'
    wait_for(lambda: not redis_client.exists(lock_key), timeout_s=10, message="lock released")
    later = bapp.unique_gate.delay(key)
    assert later.id != ids[0]
    assert later.get(timeout=30) == key
    assert redis_client.llen(f"jptest:runs:{key}") == 2
