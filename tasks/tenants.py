"""heavy queue: a tenant's monthly statement, taken round robin across tenants.

``fairness_key`` makes the heavy queue serve one statement of each tenant with work in
turn, so one big tenant's month-end backlog does not hold every other tenant's behind it
(docs/flow-control.md#fairness-between-tenants). The body stands in for the rendering
(a short sleep) and returns when it started, for the demo's report.
"""

from __future__ import annotations

import time
from typing import Any

from jobs_platform import ReliableTask
from tasks.jobs import app

#: Seconds one statement takes.
RENDER_S = 0.05


@app.task(
    base=ReliableTask,
    bind=True,
    name="tasks.tenants.build_statement",
    queue="heavy",
    fairness_key=lambda tenant, number: tenant,
)
def build_statement(self: Any, tenant: str, number: int) -> dict[str, Any]:
    started = time.time()
    time.sleep(RENDER_S)
    return {"tenant": tenant, "number": number, "started": started}
