"""delay_on_commit end to end: the reference checkout (tasks/checkout.py) as a real producer
process, a real worker of the reference app relaying and charging, a real payment gateway
on loopback, on PostgreSQL and on SQLite.

- an order rolled back after its charge was dispatched: no outbox row, no job, no charge;
- an order committed by a producer SIGKILLed right after its commit (it kills itself
  there: the crash lands in the window by construction): the worker's relay publishes the
  charge with the task id the producer printed, and the gateway sees one charge request.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from jobs_platform.db import engine_for, upgrade
from jobs_platform.outbox.model import job_outbox
from jobs_platform.testing import WorkerProcess, wait_for
from tasks.gateway import GatewayServer

pytestmark = pytest.mark.acceptance

ROOT = Path(__file__).resolve().parents[2]
CHARGE = "tasks.billing.charge_invoice"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayServer]:
    with GatewayServer() as server:
        yield server


@pytest.fixture(params=["postgresql", "sqlite"])
def env(
    request: pytest.FixtureRequest, redis_url: str, gateway: GatewayServer, tmp_path: Path
) -> dict[str, str]:
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path}/shop.sqlite3"
    upgrade(url)
    return {
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": url,
        "BILLING_GATEWAY_URL": gateway.url,
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture()
def worker(env: dict[str, str], tmp_path: Path) -> Iterator[WorkerProcess]:
    # The reference app's own worker: it relays the outbox and runs the charge.
    with WorkerProcess(
        "tasks",
        ["thirdparty", "fast"],
        env=env,
        cwd=str(ROOT),
        log_dir=str(tmp_path),
        hostname=f"checkout-{uuid.uuid4().hex[:6]}@outbox",
    ) as proc:
        yield proc


def checkout(env: dict[str, str], *flags: str) -> tuple[int, dict[str, Any]]:
    """Run the reference checkout as its own process; its exit code and what it printed."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tasks.checkout",
            "--email",
            "a@example.com",
            "--amount",
            "1990",
            *flags,
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def outbox_row(url: str, task_id: str) -> Any:
    with engine_for(url).connect() as conn:
        return conn.execute(sa.select(job_outbox).where(job_outbox.c.task_id == task_id)).first()


def invoice_status(url: str, invoice_id: int) -> str | None:
    with engine_for(url).connect() as conn:
        return conn.execute(
            sa.text("SELECT status FROM invoices WHERE id = :id"), {"id": invoice_id}
        ).scalar()


def charge_requests(gateway: GatewayServer, invoice_id: int) -> list[int]:
    key = f"{CHARGE}:invoice_id={invoice_id}"
    return [r["status"] for r in list(gateway.requests) if r["key"] == key]


def result_state(redis_url: str, task_id: str) -> str | None:
    raw = redis.Redis.from_url(redis_url).get(f"celery-task-meta-{task_id}")
    return None if raw is None else str(json.loads(raw)["status"])


def test_rolled_back_never_charges_committed_survives_a_sigkilled_producer(
    env: dict[str, str], worker: WorkerProcess, gateway: GatewayServer
) -> None:
    url = env["JOBS_DATABASE_URL"]
    code, abandoned = checkout(env, "--abandon")
    assert code == 0 and abandoned["committed"] is False
    assert outbox_row(url, abandoned["charge_task_id"]) is None  # rolled back with the order
    assert invoice_status(url, abandoned["invoice_id"]) is None

    code, placed = checkout(env, "--kill-after-commit")
    assert code == -9 and placed["committed"] is True  # died right after its commit
    invoice_id, task_id = placed["invoice_id"], placed["charge_task_id"]
    wait_for(
        lambda: invoice_status(url, invoice_id) == "paid",
        timeout_s=90,  # the relay's 0.2 s and one charge, with a loaded machine's slack
        interval_s=0.2,
        message=lambda: f"invoice {invoice_id} to be paid\n{worker.log()[-3000:]}",
    )
    # The job that ran is the one the producer was told about: its id, once.
    wait_for(lambda: result_state(env["JOBS_BROKER_URL"], task_id) == "SUCCESS", timeout_s=30)
    row = outbox_row(url, task_id)
    assert row is not None and row.published_at is not None
    assert charge_requests(gateway, invoice_id) == [201]  # one request: one charge
    assert result_state(env["JOBS_BROKER_URL"], abandoned["charge_task_id"]) is None
    if abandoned["invoice_id"] != invoice_id:  # SQLite may reuse a rolled-back row's id
        assert charge_requests(gateway, abandoned["invoice_id"]) == []
