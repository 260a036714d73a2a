"""Dispatch that commits with the transaction: ``task.delay_on_commit(session, ...)``.

::

    database.py  whether a session's database is the platform's            (pure)
    model.py     the ``job_outbox`` table (migration 0005)                   (SQLAlchemy)
    enqueue.py   the call: every check of .delay(), then a row in the
                 session's transaction                                      (SQLAlchemy)
    relay.py     the worker bootstep that publishes committed rows once,
                 and :func:`relay_once` for anything else that wants to     (Celery)
    upkeep.py    what metrics and the maintenance schedule read and prune   (SQLAlchemy)

A rolled-back transaction (or savepoint) takes its rows with it, so its jobs never exist;
a committed row is published by the first relay that claims it, with the task id the call
returned. The modules are imported by name: a producer that never dispatches on commit
never loads them.
"""

from __future__ import annotations

from typing import Any

#: The relay bootstep (a string: only workers import it).
RELAY_STEP = "jobs_platform.outbox.relay:RelayStep"


def install(app: Any) -> None:
    """Every worker of ``app`` runs the relay."""
    app.steps["worker"].add(RELAY_STEP)
