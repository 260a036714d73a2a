"""heavy queue: a tenant's monthly statement, taken round robin across tenants.

``fairness_key`` makes the heavy queue serve one statement of each tenant with work in
turn, so one big tenant's month-end backlog does not hold every other tenant's behind it
(docs/flow-control.md#fairness-between-tenants). The body stands in for the rendering
(a short sleep) and returns when it started, for the demo's report.

Only a broker that takes a queue's jobs round robin across keys (Redis) offers it; on
RabbitMQ ``fairness_key`` is refused at declaration, so the app declares the task without
it there and the heavy queue serves statements in the order they were sent
(:data:`FAIR_QUEUES` says which; ``make demo BROKER=rabbitmq`` shows the difference).
"""

from __future__ import annotations

import time
from typing import Any

from jobs_platform import ReliableTask
from jobs_platform.brokers import of as broker_of
from tasks.jobs import app

#: Seconds one statement takes.
RENDER_S = 0.05
#: Why this app's broker cannot take a queue's jobs round robin (None: it can, Redis).
NO_FAIR_QUEUES = broker_of(app).no_fair_queues
FAIR_QUEUES = NO_FAIR_QUEUES is None


def tenant_of(tenant: str, number: int) -> str:
    return tenant


@app.task(
    base=ReliableTask,
    bind=True,
    name="tasks.tenants.build_statement",
    queue="heavy",
    fairness_key=tenant_of if FAIR_QUEUES else None,
)
def build_statement(self: Any, tenant: str, number: int) -> dict[str, Any]:
    started = time.time()
    time.sleep(RENDER_S)
    return {"tenant": tenant, "number": number, "started": started}
