"""The chaos soak's app (``python -m bench.chaos``): tasks that write down every run.

Each task writes what happened to a *ledger* outside every service the soak breaks: one
append-only JSON-lines file per process under ``CHAOS_LEDGER_DIR`` (a single ``write`` on
an ``O_APPEND`` descriptor, which a SIGKILL cannot tear). A lost Redis write or database
row could then never hide a lost job, nor invent one. Records:

``run``  a run started: task id, task name, attempt number (retries + 1), whether the
         broker redelivered the message (kombu flags a restored one), and how many
         worker-lost entries its attempt history carries (a pool child killed under it);
``ok``   the run succeeded (the last thing the task does);
``end``  the run ended, however (so a pool process whose newest record is ``run`` is busy);
``dup``  a guard absorbed a duplicate: ``transition`` (status CAS) or ``key`` (key table);
``tick`` a beat run, with the slot it was sent for.

Tasks (all JSON arguments, deterministic per job, so every copy of a job behaves alike):

- ``chaos.work`` (fast) / ``chaos.crunch`` (heavy): ``plan`` decides the outcome: ``ok``,
  ``transient`` (fails its first ``fail_times`` attempts), ``exhaust`` (always transient:
  dead-lettered after ``max_retries + 1`` attempts), ``permanent`` (fails at once);
- ``chaos.charge`` (thirdparty): charges an order once through the status CAS
  (``open -> charging -> paid``) and the gateway's idempotency key;
- ``chaos.receipt`` (fast): sends an order's receipt e-mail once through the platform's
  idempotency-key table (the gateway's mailer dedupes nothing);
- ``chaos.tick`` (fast): the beat entry's task (``CHAOS_BEAT_EVERY`` seconds).

Settings come from ``JOBS_*`` (bench/chaos.py sets them); the gateway from
``CHAOS_GATEWAY_URL``; the orders table lives in the platform's database.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa

from jobs_platform import (
    IdempotencyKeys,
    PermanentError,
    ReliableTask,
    TransientError,
    Transition,
    claim_columns,
    create_app,
    schedule,
    transition,
)
from jobs_platform.db import engine_for
from jobs_platform.history import errors_of

LEDGER_ENV = "CHAOS_LEDGER_DIR"
GATEWAY_ENV = "CHAOS_GATEWAY_URL"
BEAT_ENV = "CHAOS_BEAT_EVERY"
BEAT_ENTRY = "chaos-tick"
PLANS = ("ok", "transient", "exhaust", "permanent")
#: Retries of the plain tasks (an ``exhaust`` job runs WORK_RETRIES + 1 times).
WORK_RETRIES = 3
#: Retries of the side-effecting tasks: gateway faults and the database cut are transient.
EFFECT_RETRIES = 8
#: Short waits and limits: retries take Celery's path (the soak's visibility timeout is
#: 30 s with a 10 s margin, so a wait of 10 s or more goes to the durable delayed store).
COMMON = {
    "base": ReliableTask,
    "bind": True,
    "time_limit": 10,
    "soft_time_limit": 8,
    "retry_backoff": 0.5,
    "retry_backoff_max": 2.0,
    "ignore_result": True,
}

app = create_app("chaos")


def task(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``app.task`` with the soak's common options (typed, so the tasks stay checked)."""
    decorate: Callable[[Callable[..., Any]], Any] = app.task(**{**COMMON, **options})
    return decorate


metadata = sa.MetaData()
orders = sa.Table(
    "chaos_orders",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("charge_id", sa.String(64), nullable=True),
    *claim_columns(),
)
CHARGE = Transition(orders, from_="open", to="charging", done="paid")


# -- the ledger --------------------------------------------------------------------------------


class _Ledger:
    """This process's ledger file (reopened after a fork: a pool child writes its own)."""

    def __init__(self) -> None:
        self.pid = -1
        self.fd = -1

    def write(self, record: dict[str, Any]) -> None:
        if self.pid != os.getpid():
            directory = os.environ[LEDGER_ENV]
            path = os.path.join(directory, f"{os.getpid()}.jsonl")
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.pid = os.getpid()
        os.write(self.fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())


_ledger = _Ledger()


def note(event: str, task_id: str, **fields: Any) -> None:
    _ledger.write({"e": event, "id": task_id, "ts": round(time.time(), 3), **fields})


@contextlib.contextmanager
def attempt(task: Any) -> Iterator[None]:
    """Write the run down, and its end however it ends (the soak reads a pool process whose
    newest record is a ``run`` as busy with a job)."""
    run_started(task)
    try:
        yield
    finally:
        note("end", task.request.id)


def run_started(task: Any) -> None:
    request = task.request
    delivery = request.delivery_info or {}
    lost = sum(
        1 for item in errors_of(request.headers) if "WorkerLost" in str(item.get("type", ""))
    )
    note(
        "run",
        request.id,
        task=task.name,
        attempt=int(request.retries or 0) + 1,
        redelivered=bool(delivery.get("redelivered")),
        lost=lost,
    )


# -- plain work --------------------------------------------------------------------------------


def _follow(task: Any, plan: str, fail_times: int) -> None:
    attempt = int(task.request.retries or 0) + 1
    if plan == "permanent":
        raise PermanentError(f"{task.request.id}: permanent by plan")
    if plan == "exhaust" or (plan == "transient" and attempt <= fail_times):
        raise TransientError(f"{task.request.id}: transient by plan (attempt {attempt})")
    note("ok", task.request.id)


@task(name="chaos.work", queue="fast", max_retries=WORK_RETRIES)
def work(self: Any, n: int, plan: str, fail_times: int) -> None:
    with attempt(self):
        _follow(self, plan, fail_times)


@task(name="chaos.crunch", queue="heavy", max_retries=WORK_RETRIES)
def crunch(self: Any, n: int, plan: str, fail_times: int) -> None:
    with attempt(self):
        # Heavy-queue work takes a while (mostly waiting, to spare the machine's CPU): a
        # pool process killed mid-job is likely to be in the middle of one of these.
        sum(i * i for i in range(2000))
        time.sleep(0.05)
        _follow(self, plan, fail_times)


# -- guarded side effects ----------------------------------------------------------------------


def database() -> sa.Engine:
    return engine_for(app.jobs_settings.database_url)


class GatewayClient:
    """The soak gateway's client: 5xx and unreachable are transient, other 4xx permanent."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def post(self, path: str, payload: dict[str, Any], key: str | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if key is not None:
            headers["Idempotency-Key"] = key
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(payload).encode(), method="POST", headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                raise TransientError(f"gateway answered HTTP {exc.code} on {path}") from None
            raise PermanentError(f"gateway refused {path}: HTTP {exc.code}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            raise TransientError(f"gateway unreachable on {path}: {exc}") from exc


def gateway() -> GatewayClient:
    return GatewayClient(os.environ[GATEWAY_ENV])


@transition(
    CHARGE, id_arg="order_id", engine=database, done_values=lambda c: {"charge_id": c["id"]}
)
def _charge_once(task: Any, order_id: int) -> dict[str, Any]:
    with database().connect() as conn:
        amount = conn.execute(sa.select(orders.c.amount_cents).where(orders.c.id == order_id))
        amount_cents = int(amount.scalar_one())
    return dict(
        gateway().post(
            "/charges",
            {"reference": f"order-{order_id}", "amount_cents": amount_cents},
            key=task.idempotency_key,
        )
    )


@task(
    name="chaos.charge", queue="thirdparty", max_retries=EFFECT_RETRIES, business_key=("order_id",)
)
def charge(self: Any, order_id: int) -> None:
    with attempt(self):
        if _charge_once(self, order_id) is None:
            note("dup", self.request.id, guard="transition")
        note("ok", self.request.id)


@task(name="chaos.receipt", queue="fast", max_retries=EFFECT_RETRIES, business_key=("order_id",))
def receipt(self: Any, order_id: int) -> None:
    sent: list[bool] = []

    def send() -> dict[str, Any]:
        sent.append(True)
        return dict(gateway().post("/emails", {"reference": f"order-{order_id}"}))

    with attempt(self):
        IdempotencyKeys.for_app(self.app).run_once(self.idempotency_key, send, task=self.name)
        if not sent:
            note("dup", self.request.id, guard="key")
        note("ok", self.request.id)


# -- beat --------------------------------------------------------------------------------------


@task(name="chaos.tick", queue="fast", max_retries=WORK_RETRIES)
def tick(self: Any) -> None:
    with attempt(self):
        slot = (self.request.headers or {}).get(schedule.SLOT_HEADER)
        note("tick", self.request.id, slot=slot)
        note("ok", self.request.id)


if os.environ.get(BEAT_ENV):
    app.conf.beat_schedule = {
        BEAT_ENTRY: {
            "task": "chaos.tick",
            "schedule": dt.timedelta(seconds=float(os.environ[BEAT_ENV])),
            # Every slot sent, late ones too: the soak counts slots against runs.
            "options": {"overlap": "allow", "catch_up": 100},
        }
    }
