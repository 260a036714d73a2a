"""Batches: many small jobs with a visible whole, exact counts and once-only callbacks.

::

    from jobs_platform import batch

    b = batch("import 2024-06", [import_rows.s(chunk) for chunk in chunks],
              on_complete=reindex.s(), on_success=notify.s(), on_failure=page_oncall.s())
    b.id

::

    model.py     job_batches, job_batch_members (migration 0007)           (SQLAlchemy)
    counting.py  a member's outcome and the counters in one transaction;
                 the settling transition writes the callbacks to the outbox (SQLAlchemy)
    members.py   check every member (bulk's checks), publish with the header (bulk)
    create.py    batch(): check, write the batch, publish; cancel            (SQLAlchemy)
    marks.py     the open mark on the coordination Redis: the cheap "cancelled?" (Redis)
    running.py   the member side: cancelled? succeeded; self.batch.add()    (Celery)
    state.py     what `batch list/show`, metrics and retention read          (SQLAlchemy)

This module is light (no SQLAlchemy): a producer that never creates a batch never loads it.
docs/batches.md is the whole story.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class Batch:
    """A created batch: ``.id``, ``.name``, the members' AsyncResults (``.results``, in
    the order given), :meth:`state` and :meth:`cancel`."""

    def __init__(self, app: Any, id: str, name: str, results: list[Any]) -> None:
        self.app = app
        self.id = id
        self.name = name
        self.results = results

    def state(self) -> Any:
        """The batch's row now (:class:`jobs_platform.batches.state.BatchState`)."""
        from jobs_platform.batches import state  # SQLAlchemy: on use

        return state.get(self.app, self.id)

    def cancel(self, reason: str) -> bool:
        """Members not started yet will not run; whether this call cancelled the batch."""
        from jobs_platform.batches import create  # SQLAlchemy: on use

        return bool(create.cancel(self.app, self.id, reason))

    def __repr__(self) -> str:
        return f"<Batch {self.id} {self.name!r} of {len(self.results)}>"


def batch(
    name: str,
    signatures: Iterable[Any],
    *,
    on_success: Any = None,
    on_complete: Any = None,
    on_failure: Any = None,
    app: Any = None,
) -> Batch:
    """Dispatch ``signatures`` (of ReliableTasks) as one batch named ``name``.

    Every member is checked first (bulk dispatch's checks and the batch's rules): one
    refusal raises :class:`~jobs_platform.bulk.BulkDispatchError` and nothing is created or
    sent. The callbacks (Celery signatures) are each called once with the batch id as the
    first argument: ``on_complete`` when every member has settled (succeeded, dead or
    cancelled) the first time, ``on_success`` when every member has succeeded (also later,
    after the last dead member's replay succeeded), ``on_failure`` when the first member
    dies. ``app`` defaults to the signatures' (Celery's current app for an empty batch).
    """
    sigs = list(signatures)
    if app is None:
        app = sigs[0].app if sigs and hasattr(sigs[0], "app") else _current_app()
    from jobs_platform.batches import create  # SQLAlchemy: on use

    made = create.create(
        app,
        name,
        sigs,
        {"on_complete": on_complete, "on_success": on_success, "on_failure": on_failure},
    )
    return Batch(app, made.id, made.name, made.results)


def _current_app() -> Any:
    from celery import current_app

    return current_app._get_current_object()


__all__ = ["Batch", "batch"]
