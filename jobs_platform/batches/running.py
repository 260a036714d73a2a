"""What a batch member does in the worker (``ReliableTask`` calls these for a message that
carries the batch header).

- :func:`before_body`: before each attempt's body, a member of a cancelled batch is counted
  ``cancelled`` and ends with ``Ignore`` (acknowledged, no dead letter, no retry);
- :func:`succeeded`: after the body returned, in the pool process and before the message is
  acknowledged, the member is counted ``succeeded`` (a failure of that write is the
  attempt's failure: retried like any other, and the next run counts once);
- :class:`MemberBatch`: ``self.batch`` in a running member, whose :meth:`~MemberBatch.add`
  adds members to the batch.

A member's death is counted where its dead letter is stored
(:meth:`jobs_platform.deadletter.store.DeadLetterStore.add`).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import Any

from celery.exceptions import Ignore

from jobs_platform import db, history
from jobs_platform.batches import counting, marks, members
from jobs_platform.errors import DispatchError

logger = logging.getLogger("jobs_platform.batches")

_ADDED = uuid.UUID("0b2c59f5-4f7e-4b39-8d0f-6a6f62736164")
_ADDS_ATTR = "jobs_batch_adds"


def membership(request: Any) -> tuple[str, str] | None:
    """``(batch id, member id)`` of the running job, or ``None`` for a job of no batch."""
    headers = request.headers or {}
    batch_id = headers.get(history.BATCH_HEADER)
    if not isinstance(batch_id, str):
        return None
    member = headers.get(history.BATCH_MEMBER_HEADER) or request.id
    return batch_id, str(member)


def before_body(task: Any, batch_id: str, member_id: str) -> None:
    """Raise ``Ignore`` (after counting the member cancelled) if the batch is cancelled."""
    if marks.is_open(task.app, batch_id):
        return  # one EXISTS on the coordination Redis instead of an SQL read (marks.py)
    engine = db.engine_for(task.app.jobs_settings.database_url)
    with engine.connect() as conn:
        if not counting.is_cancelled(conn, batch_id):
            return
    with engine.begin() as conn:
        counting.record(conn, batch_id, member_id, "cancelled", task_name=task.name)
    logger.info(
        "%s[%s]: batch %s is cancelled; the member does not run",
        task.name,
        task.request.id,
        batch_id,
        extra={"event": "jobs.batch.member_cancelled", "task_name": task.name},
    )
    raise Ignore()


def succeeded(task: Any, batch_id: str, member_id: str) -> None:
    # Most members: one statement, its own transaction (counting.record_plain); the rest
    # (a duplicate, an added or replayed member, the one that settles the batch) take the
    # full transaction, which writes the callbacks to the outbox.
    url = task.app.jobs_settings.database_url
    counting.record_alone(url, batch_id, member_id, "succeeded", task_name=task.name)


class MemberBatch:
    """The batch of the running member (``self.batch`` in a ReliableTask)."""

    def __init__(self, task: Any, batch_id: str, member_id: str) -> None:
        self.task = task
        self.id = batch_id
        self.member_id = member_id

    def add(self, signatures: Iterable[Any]) -> list[Any]:
        """Add ``signatures`` as members of this batch and publish them; their AsyncResults.

        Checked as ``batch()`` checks its members (one refusal adds none). The new members
        are counted (``total``, ``pending``) in one transaction before they are published,
        and while this member is still pending, so the batch cannot settle without them.
        Their task ids derive from this member and the position of the call and of the
        signature: a re-run of this member (a retry, a redelivery, a replay) that adds the
        same members in the same order adds each once (publishing it again, at least once,
        under the same id).
        """
        sigs = list(signatures)
        request = self.task.request
        if request.called_directly:
            raise DispatchError(f"{self.task.name}: batch.add() needs a running batch member")
        seq = int(getattr(request, _ADDS_ATTR, 0) or 0)
        setattr(request, _ADDS_ATTR, seq + 1)
        ids = [
            str(uuid.uuid5(_ADDED, f"{self.id}:{self.member_id}:{seq}:{i}"))
            for i in range(len(sigs))
        ]
        app = self.task.app
        groups = members.plan(app, sigs, self.id, task_ids=ids)
        engine = db.engine_for(app.jobs_settings.database_url)
        with engine.begin() as conn:
            added = [(task_id, name) for _, task_id, name in members.task_ids(groups)]
            counting.add_members(conn, self.id, added)
        return members.publish(groups, len(sigs))


def member_batch(task: Any) -> MemberBatch | None:
    found = membership(task.request)
    return None if found is None else MemberBatch(task, *found)
