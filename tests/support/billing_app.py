"""The reference billing tasks on a test app that real worker processes run.

Visibility timeout 30 s (margin 2 s, sweep every 1 s), so a killed worker's message comes
back within half a minute; every task's hard limit (24 s) plus the longest retry wait
(1 s) stays below it (a retry waiting for its countdown is held unacknowledged, then
runs). The hooks below never decide timing on their own: they wait for an explicit signal
from the test, up to ``HOOK_DEADLINE_S`` (generous, and below the soft limit so a lost
test never leaves a task stuck). A test steers a delivery through Redis keys (its own DB):

* ``jptest:barrier:<invoice>`` present: each delivery, before claiming, appends its worker
  (``request.hostname``) to ``jptest:barrier:<invoice>:arrived`` and waits for
  ``jptest:barrier:<invoice>:go``; the test sees who arrived, then opens the barrier;
* ``jptest:kill-worker-after-charge:<invoice>`` present: right after the gateway charged
  (before ``paid`` is written and before the ack) the delivery SIGKILLs its whole worker
  (main process and pool children), once: the crash comes exactly at that point;
* ``jptest:fail-after-charge:<invoice>`` present: the delivery fails permanently right
  after the gateway charged (once), so the job ends in the dead-letter table;
* ``jptest:kill-child-after-charge:<invoice>`` present: the pool child SIGKILLs itself
  right after the gateway charged (once); Celery retries the job as a lost worker.

Every pool process sets ``jptest:pool-ready:<hostname>`` once its start-up
(``worker_process_init``, the platform's receivers first) has returned: "ready." in a log
only says the main process consumes, and a worker whose pool process hangs in its start-up
takes one job and never runs it.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis
from celery import current_task, signals

from jobs_platform import PermanentError, ReliableTask, create_app
from tasks import billing

VISIBILITY_TIMEOUT_S = 30.0
VISIBILITY_MARGIN_S = 2.0
RETRY_BACKOFF_MAX_S = 1.0
TIME_LIMIT_S = 24.0  # + RETRY_BACKOFF_MAX_S < VISIBILITY_TIMEOUT_S - VISIBILITY_MARGIN_S
SOFT_TIME_LIMIT_S = 22.0
#: How long a hook waits for the test's signal: generous, yet below the soft time limit.
HOOK_DEADLINE_S = 20.0

app = create_app(
    "billingtest",
    broker_url=os.environ["JOBS_BROKER_URL"],
    visibility_timeout=VISIBILITY_TIMEOUT_S,
    visibility_margin=VISIBILITY_MARGIN_S,
    unacked_restore_interval=1.0,
    worker_lease=4.0,
    retry_backoff=0.3,
    retry_backoff_max=RETRY_BACKOFF_MAX_S,
    max_retries=3,
    dlq_drain_interval=0.5,
)
_redis = redis.Redis.from_url(app.conf.broker_url, socket_timeout=10, socket_connect_timeout=10)

#: Set by each pool process of worker ``hostname`` when its start-up is over (module doc).
POOL_READY_KEY = "jptest:pool-ready:{hostname}"


def _pool_ready(sender: Any = None, **_: Any) -> None:
    # Connected after create_app() connected the platform's receivers, so it runs after them.
    _redis.set(POOL_READY_KEY.format(hostname=sender), os.getpid())


signals.worker_process_init.connect(_pool_ready, weak=False, dispatch_uid="jptest.pool_ready")


def _wait_for_signal(key: str) -> bool:
    """Poll until the test sets ``key``; False if ``HOOK_DEADLINE_S`` passed first."""
    deadline = time.monotonic() + HOOK_DEADLINE_S
    while not _redis.exists(key):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _before_claim(invoice_id: int) -> None:
    key = f"jptest:barrier:{invoice_id}"
    if not _redis.exists(key):
        return
    _redis.rpush(f"{key}:arrived", str(current_task.request.hostname))
    _wait_for_signal(f"{key}:go")


def _after_charge(invoice_id: int, charge: dict[str, Any]) -> None:
    if _redis.delete(f"jptest:kill-child-after-charge:{invoice_id}"):
        os.kill(os.getpid(), signal.SIGKILL)
    if _redis.delete(f"jptest:kill-worker-after-charge:{invoice_id}"):
        # The worker runs in its own session (WorkerProcess): SIGKILL its whole group, this
        # pool child included, exactly here. No done state, no ack, no release.
        os.killpg(os.getpgid(0), signal.SIGKILL)
    if _redis.delete(f"jptest:fail-after-charge:{invoice_id}"):
        raise PermanentError(f"bookkeeping for invoice {invoice_id} failed after the charge")


_tasks = billing.register(
    app,
    hooks=billing.Hooks(before_claim=_before_claim, after_charge=_after_charge),
    time_limit=TIME_LIMIT_S,
    soft_time_limit=SOFT_TIME_LIMIT_S,
    unique_for=30,
)
charge_invoice = _tasks.charge_invoice
send_invoice_email = _tasks.send_invoice_email


@app.task(
    base=ReliableTask,
    bind=True,
    name="tests.unique_gate",
    queue="fast",
    business_key=("key",),
    unique_for=30,
    time_limit=TIME_LIMIT_S,
    soft_time_limit=SOFT_TIME_LIMIT_S,
)
def unique_gate(self: Any, key: str) -> str:
    """Records its run, then holds its slot until the test opens ``jptest:gate:<key>``."""
    _redis.rpush(f"jptest:runs:{key}", self.request.id)
    _wait_for_signal(f"jptest:gate:{key}")
    return key
