"""The dead-letter table: every terminal failure stored once, with what a replay needs.

::

    hooks.py    where Celery hands over a dead job: task_failure/task_revoked receivers,
                the consumer that records poison messages, the worker Request that marks
                the request its thread is finishing                      (Celery)
    letters.py  a DeadLetter built from what Celery knows when a job dies (Celery objects)
    sink.py     capture: redact, spool, insert-or-ignore, alert; breaker  (SQLAlchemy)
    drainer.py  bootstep: migrate at start (db.try_upgrade); drain the spool every
                interval or when woken; one pass for ``dlq drain``        (Celery, SQLAlchemy)
    spool.py    the durable spool on the broker                           (Redis)
    store.py    insert-or-ignore, listing, stats, replay/discard/purge   (SQLAlchemy)
    model.py    the dead_letter_jobs table                                (SQLAlchemy)
    record.py   DeadLetter (plain data), fingerprint, redaction, storable (pure)
    alerts.py   ERROR log line, aggregated webhook
    metrics.py  Prometheus counters
    replay.py   replay rows through the normal dispatch, an outcome each  (Celery)

Data flows one way: hooks -> letters -> record; hooks -> sink -> spool, store, alerts;
hooks -> drainer (wake only); drainer -> sink, jobs_platform.db; replay -> store. The CLI
(:mod:`jobs_platform.cli.dlq`) renders what replay, drainer and store return.

:func:`install` wires it into an app (:func:`jobs_platform.create_app` calls it). It
imports :mod:`.hooks` only, so ``import jobs_platform`` and ``create_app()`` never load
SQLAlchemy: the hooks import the sink and the drainer when a job dies, Celery imports the
drainer and the consumer (given by name) when a worker starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jobs_platform.deadletter.record import DeadLetter

if TYPE_CHECKING:
    from jobs_platform.deadletter.store import DeadLetterStore, Filter

#: ``worker_consumer`` for apps made by create_app (a string: only workers import it).
CONSUMER = "jobs_platform.deadletter.hooks:DeadLetterConsumer"
#: The drainer bootstep (a string for the same reason).
DRAINER_STEP = "jobs_platform.deadletter.drainer:DeadLetterStep"

__all__ = ["CONSUMER", "DeadLetter", "DeadLetterStore", "Filter", "install"]


def __getattr__(name: str) -> Any:
    # The store imports SQLAlchemy, which a producer never needs: loaded on first use.
    if name in ("DeadLetterStore", "Filter"):
        from jobs_platform.deadletter import store

        return getattr(store, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def install(app: Any) -> None:
    """Add the drainer bootstep and connect the receivers (``worker_consumer`` is config)."""
    from jobs_platform.deadletter import hooks

    app.steps["worker"].add(DRAINER_STEP)
    hooks.connect()
