"""The dead-letter table: every terminal failure stored once, with what a replay needs.

::

    record.py    DeadLetter (plain data), fingerprint, redaction, storable (pure)
    model.py     the dead_letter_jobs table                               (SQLAlchemy)
    store.py     insert-or-ignore, listing, stats, replay/discard/purge  (SQLAlchemy)
    spool.py     the durable spool on the broker                          (Redis)
    sink.py      capture = spool, then database; drain the spool          (no Celery)
    alerts.py    ERROR log line, aggregated webhook
    metrics.py   Prometheus counters
    receiver.py  task_failure / task_revoked receivers                    (Celery)
    poison.py    consumer that records poison messages; worker Request    (Celery)
    worker.py    bootstep: migrate at start, drain the spool              (Celery)
    replay.py    replay a row through the normal dispatch                 (Celery)
    wake.py      the event that wakes the drainer                         (pure)

SQLAlchemy is imported only by model/store/sink (and the CLI): the receivers and the
bootstep import them when a job dies or a worker starts, never at ``import jobs_platform``.

:func:`install` wires it into an app; :func:`jobs_platform.create_app` calls it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jobs_platform.deadletter.record import DeadLetter

if TYPE_CHECKING:
    from jobs_platform.deadletter.store import DeadLetterStore, Filter

#: ``worker_consumer`` for apps made by create_app (a string: only workers import it).
CONSUMER = "jobs_platform.deadletter.poison:DeadLetterConsumer"

__all__ = ["CONSUMER", "DeadLetter", "DeadLetterStore", "Filter", "install"]

#: Loaded on first use: they import SQLAlchemy, which a producer never needs.
_LAZY = {
    "DeadLetterStore": "jobs_platform.deadletter.store",
    "Filter": "jobs_platform.deadletter.store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def install(app: Any) -> None:
    """Add the drainer bootstep and connect the receivers (``worker_consumer`` is config).

    Cheap: the receivers and the bootstep import SQLAlchemy and the table only when a job
    dies or a worker starts, so ``import jobs_platform`` in a producer does not.
    """
    from celery import signals

    from jobs_platform.deadletter import receiver
    from jobs_platform.deadletter.worker import DeadLetterStep

    app.steps["worker"].add(DeadLetterStep)
    receiver.connect()
    signals.worker_process_init.connect(
        _dispose_engines, weak=False, dispatch_uid="jobs.db.dispose_engines"
    )


def _dispose_engines(**_: Any) -> None:
    from jobs_platform.db import dispose_engines

    dispose_engines()
    # A pool child loads the capture path now, not on its first failing task.
    importlib.import_module("jobs_platform.deadletter.sink")
