"""The reference billing tasks on a test app that real worker processes run.

Short visibility timeout (10 s, margin 2 s, sweep every 1 s) so a killed worker's message
comes back within seconds; every task's hard limit (6 s) and retry cap stay below it.
Two hooks let a test steer a delivery through Redis keys (the test's own Redis DB):

* ``jptest:barrier:<invoice>`` = N: each delivery waits before claiming until N arrived,
  so N workers really race for the claim;
* ``jptest:pause:<invoice>`` present: the delivery stops right after the gateway charged
  (before ``paid`` is written and before the ack), so a test can SIGKILL it there;
* ``jptest:fail-after-charge:<invoice>`` present: the delivery fails permanently right
  after the gateway charged (once), so the job ends in the dead-letter table.
* ``jptest:kill-child-after-charge:<invoice>`` present: the pool child SIGKILLs itself
  right after the gateway charged (once); Celery retries the job as a lost worker.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import redis

from jobs_platform import PermanentError, ReliableTask, create_app
from tasks import billing

app = create_app(
    "billingtest",
    broker_url=os.environ["JOBS_BROKER_URL"],
    visibility_timeout=10.0,
    visibility_margin=2.0,
    unacked_restore_interval=1.0,
    retry_backoff=0.3,
    retry_backoff_max=1.0,
    max_retries=3,
    dlq_drain_interval=0.5,
)
_redis = redis.Redis.from_url(app.conf.broker_url)
HOOK_BOUND_S = 4.0  # below the soft time limit (5.4 s): a stuck hook never outlives the task


def _before_claim(invoice_id: int) -> None:
    key = f"jptest:barrier:{invoice_id}"
    wanted = _redis.get(key)
    if wanted is None:
        return
    _redis.incr(f"{key}:arrived")
    deadline = time.monotonic() + HOOK_BOUND_S
    while int(_redis.get(f"{key}:arrived") or 0) < int(wanted) and time.monotonic() < deadline:
        time.sleep(0.005)


def _after_charge(invoice_id: int, charge: dict[str, Any]) -> None:
    if _redis.delete(f"jptest:kill-child-after-charge:{invoice_id}"):
        os.kill(os.getpid(), signal.SIGKILL)
    if _redis.delete(f"jptest:fail-after-charge:{invoice_id}"):
        raise PermanentError(f"bookkeeping for invoice {invoice_id} failed after the charge")
    deadline = time.monotonic() + HOOK_BOUND_S
    while _redis.exists(f"jptest:pause:{invoice_id}") and time.monotonic() < deadline:
        time.sleep(0.02)


_tasks = billing.register(
    app,
    hooks=billing.Hooks(before_claim=_before_claim, after_charge=_after_charge),
    time_limit=6,
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
    time_limit=6,
)
def unique_gate(self: Any, key: str) -> str:
    """Records its run, then holds its slot until the test opens ``jptest:gate:<key>``."""
    _redis.rpush(f"jptest:runs:{key}", self.request.id)
    deadline = time.monotonic() + HOOK_BOUND_S
    while not _redis.exists(f"jptest:gate:{key}") and time.monotonic() < deadline:
        time.sleep(0.02)
    return key
