"""The platform's app on RabbitMQ for tests/acceptance/test_rabbitmq_operations.py: connection
loss with a guarded side effect, health, metrics, unique dispatch and a global rate limit.

Workers and the test read ``JOBS_BROKER_URL`` (the module's vhost), ``JOBS_COORDINATION_URL``
(the session's Redis database: runs are recorded there, tests.support.recording) and
``JOBS_DATABASE_URL`` (the module's PostgreSQL: idempotency keys, dead letters). The side
effect of ``ops.effect`` is an append to ``jptest:effects:<job>``, done at most once per job
through the idempotency key in PostgreSQL (IdempotencyKeys.run_once); ``ops.unguarded`` does
the same append with no guard, so a test can show what the guard prevents.
"""

from __future__ import annotations

import time
from typing import Any

from jobs_platform import ReliableTask, TransientError, create_app
from jobs_platform.idempotency.keys import IdempotencyKeys
from tests.support.recording import client, record

#: ``ops.limited``'s rate: one start every 0.25 s across every worker.
RATE = "4/s"

app = create_app("rmqops", retry_backoff=0.2, retry_backoff_max=1.0, dlq_drain_interval=0.5)


def _effect(job: str, task_id: str | None) -> str:
    client().rpush(f"jptest:effects:{job}", str(task_id))
    return "done"


@app.task(
    base=ReliableTask,
    bind=True,
    name="ops.effect",
    queue="fast",
    business_key=("job",),
    time_limit=30,
)
def effect(self: Any, job: str, after_s: float = 0.0) -> str:
    """The side effect once (its idempotency key), then ``after_s`` more seconds of work with
    the message still unacknowledged: a connection lost then sends the job round again."""
    record(self, job)
    keys = IdempotencyKeys.for_app(self.app)
    outcome = keys.run_once(
        self.idempotency_key, lambda: _effect(job, self.request.id), task=self.name
    )
    time.sleep(after_s)
    client().rpush(f"jptest:done:{job}", str(self.request.id))
    return str(outcome)


@app.task(base=ReliableTask, bind=True, name="ops.unguarded", queue="fast", time_limit=30)
def unguarded(self: Any, job: str, after_s: float = 0.0) -> str:
    record(self, job)
    _effect(job, self.request.id)
    time.sleep(after_s)
    client().rpush(f"jptest:done:{job}", str(self.request.id))
    return "done"


@app.task(base=ReliableTask, bind=True, name="ops.limited", queue="fast", rate_limit=RATE)
def limited(self: Any, key: str) -> None:
    record(self, key)


@app.task(
    base=ReliableTask,
    bind=True,
    name="ops.charge",
    queue="fast",
    business_key=("order_id",),
    unique_for=60,
)
def charge(self: Any, order_id: int, key: str) -> None:
    record(self, key)


@app.task(
    base=ReliableTask,
    bind=True,
    name="ops.waits",
    queue="fast",
    max_retries=5,
    retry_backoff_max=4.0,  # a wait asked for is kept below it
)
def waits(self: Any, key: str, waits_s: list[float]) -> int:
    """Fails run n asking for a wait of ``waits_s[n - 1]``, then succeeds: each wait goes
    through RabbitMQ's delay queues (celery_delayed_N, one per set bit of the seconds)."""
    n = record(self, key)
    if n <= len(waits_s):
        raise TransientError(f"wait {waits_s[n - 1]} s", retry_after_s=waits_s[n - 1])
    return n


@app.task(base=ReliableTask, name="ops.parked", queue="heavy")
def parked(n: int) -> int:
    """On a queue no worker of the module consumes: it waits there (queue depths)."""
    return n
