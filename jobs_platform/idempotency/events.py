"""The one place duplicates are logged and counted (``jobs_duplicates_skipped_total``).

Every guard reports a suppressed duplicate here with a stable ``event`` key, so the
count of repeated deliveries that did *not* repeat a side effect is visible.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

logger = logging.getLogger("jobs_platform.idempotency")

#: Duplicates suppressed, by task and by guard (``transition``, ``key``, ``unique``).
DUPLICATES_SKIPPED = Counter(
    "jobs_duplicates_skipped",
    "Deliveries or dispatches recognised as duplicates; their side effect did not run.",
    ["task", "guard"],
)


def skipped(task: str, guard: str, message: str, *args: object) -> None:
    DUPLICATES_SKIPPED.labels(task=task, guard=guard).inc()
    logger.info(message, *args, extra={"event": f"jobs.{guard}.duplicate", "task_name": task})


def skipped_count(task: str, guard: str) -> float:
    """The counter's value in this process (for tests and the demo)."""
    return float(DUPLICATES_SKIPPED.labels(task=task, guard=guard)._value.get())
