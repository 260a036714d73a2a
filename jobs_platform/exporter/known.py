"""Every label value the exporter knows before anything happened, so each counter series is
served from the exporter's start at 0 (an alert's ``increase()`` then sees the first event,
and a dashboard shows 0, not "no data").

Known from the app: its tasks (each with the queue it runs on), the dead-letter reasons,
each task's rate key, beat's entries; and the fixed sets the platform's code uses (write
failure stages, webhook outcomes, duplicate guards, the names the platform patches). Open
label sets stay open: an exception class appears when it first fails something.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from jobs_platform import cheap_retry
from jobs_platform.deadletter.metrics import POISON_LABEL
from jobs_platform.deadletter.model import REASONS
from jobs_platform.flow.state import declared_breakers
from jobs_platform.metrics import names

#: ``jobs_dead_letter_write_failures_total{stage}`` (jobs_platform.deadletter.metrics).
WRITE_FAILURE_STAGES = ("db", "spool", "lost", "receiver", "rejected", "unreadable")
WEBHOOK_OUTCOMES = ("ok", "error")
#: ``jobs_duplicates_skipped_total{guard}`` (jobs_platform.idempotency.events).
GUARDS = ("transition", "key", "unique")


def task_queues(app: Any) -> list[tuple[str, str]]:
    """(task name, queue) of every task the app runs (Celery's own built-ins left out)."""
    router = getattr(app, "jobs_router", None)
    default = str(app.jobs_settings.default_queue)
    out = []
    for name, task in sorted(app.tasks.items()):
        if name.startswith("celery."):
            continue
        spec = getattr(task, "spec", None)
        queue = spec.queue if spec is not None else None
        if queue is None and router is not None:
            queue = router.queue_for(name)
        out.append((name, str(queue or default)))
    return out


def label_values(app: Any) -> dict[str, list[tuple[str, ...]]]:
    """Counter sample name -> every label-value tuple to serve at 0 when none was recorded."""
    tasks = task_queues(app)
    per_task = list(tasks)
    poison = [(POISON_LABEL, queue) for queue in sorted({q for _, q in tasks})]
    rate_keys = sorted(
        {
            t.spec.rate_key
            for t in app.tasks.values()
            if getattr(t, "spec", None) and t.spec.rate_key
        }
    )
    entries = sorted((app.conf.beat_schedule or {}).keys())
    known: dict[str, Iterable[tuple[str, ...]]] = {
        metric.name: per_task
        for metric in (
            names.TASK_RECEIVED,
            names.TASK_STARTED,
            names.TASK_SUCCEEDED,
            names.TASK_RETRIED,
        )
    }
    known[names.DEAD_LETTERS.name] = [
        *((t, q, r) for (t, q), r in itertools.product(per_task, REASONS) if r != "poison"),
        *((t, q, "poison") for t, q in poison),
    ]
    known[names.DEAD_LETTER_WRITE_FAILURES.name] = [(s,) for s in WRITE_FAILURE_STAGES]
    known[names.DEAD_LETTER_WEBHOOK_REQUESTS.name] = [(o,) for o in WEBHOOK_OUTCOMES]
    known[names.DUPLICATES_SKIPPED.name] = list(itertools.product([t for t, _ in per_task], GUARDS))
    known[names.RATE_DEFERRED.name] = [(key,) for key in rate_keys]
    for metric in (names.BREAKER_DEFERRED, names.BREAKER_OPENED):
        known[metric.name] = [(key,) for key in declared_breakers(app)]
    for metric, option in (
        (names.CONCURRENCY_WAITED, "concurrency"),
        (names.DEBOUNCE_COLLAPSED, "debounce"),
    ):
        known[metric.name] = [
            (t.name,)
            for t in sorted(app.tasks.values(), key=lambda t: str(t.name))
            if getattr(getattr(t, "spec", None), option, None) is not None
        ]
    known[names.INTERNALS_UNAVAILABLE.name] = [(cheap_retry.PATCHED,)]
    known[names.BEAT_SENT.name] = [(entry,) for entry in entries]
    return {name: list(values) for name, values in known.items()}
