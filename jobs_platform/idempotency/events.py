"""The one place duplicates are logged and counted (``jobs_duplicates_skipped_total``).

Every guard reports a suppressed duplicate here with a stable ``event`` key, so the
count of repeated deliveries that did *not* repeat a side effect is visible.
"""

from __future__ import annotations

import logging

from jobs_platform.metrics import names
from jobs_platform.metrics.counters import RecordedCounter

logger = logging.getLogger("jobs_platform.idempotency")

#: Duplicates suppressed, by task and by guard (``transition``, ``key``, ``unique``).
#: Recorded for the exporter (jobs_platform.metrics) and kept per process.
DUPLICATES_SKIPPED = RecordedCounter(names.DUPLICATES_SKIPPED)


def skipped(task: str, guard: str, message: str, *args: object) -> None:
    DUPLICATES_SKIPPED.labels(task=task, guard=guard).inc()
    logger.info(message, *args, extra={"event": f"jobs.{guard}.duplicate", "task_name": task})


def skipped_count(task: str, guard: str) -> float:
    """The counter's value in this process (for tests and the demo)."""
    return DUPLICATES_SKIPPED.labels(task=task, guard=guard).value()
