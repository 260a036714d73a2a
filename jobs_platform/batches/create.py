"""``batch(name, signatures, ...)``: check every member, write the batch, publish the members.

Order, so that a refusal leaves nothing behind and no member can settle an unwritten batch:

1. the callbacks and every member are checked (:mod:`.members`); one refusal raises
   :class:`~jobs_platform.bulk.BulkDispatchError` and nothing is written or sent;
2. the batch row (``total = pending = len(signatures)``) is committed;
3. the members are published through the bulk path with the batch header.

A broker failure in step 3 raises the bulk's error (the batch id in its message): the
members never sent are counted ``cancelled`` at once, so the batch still settles; those
written when the connection failed (``uncertain``: each queued once or not at all) stay
pending until they run (a documented limit: docs/batches.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import redis
import sqlalchemy as sa
from celery.utils import uuid

from jobs_platform import arguments, db, rules
from jobs_platform.batches import counting, marks, members
from jobs_platform.batches.model import batches
from jobs_platform.bulk.calls import BulkDispatchError, check_arguments
from jobs_platform.bulk.messages import COPYABLE_OPTIONS
from jobs_platform.errors import DispatchError, JobsPlatformError

#: The options a callback may carry: those the outbox relay sends as given.
CALLBACK_OPTIONS = COPYABLE_OPTIONS - {"task_id"}


@dataclasses.dataclass(frozen=True)
class Created:
    id: str
    name: str
    results: list[Any]


def create(
    app: Any,
    name: str,
    signatures: Iterable[Any],
    callbacks: Mapping[str, Any],
) -> Created:
    rules.check_batch_name(name)
    sigs = list(signatures)
    batch_id = uuid()
    encoded = {
        which: encode_callback(app, which, callback, batch_id)
        for which, callback in callbacks.items()
        if callback is not None
    }
    groups = members.plan(app, sigs, batch_id)  # raises before anything is written
    engine = db.engine_for(app.jobs_settings.database_url)
    with engine.begin() as conn:
        counting.create(conn, batch_id, name, len(sigs), encoded)
    if sigs:
        marks.mark_open(app, batch_id)  # before any member can ask
    try:
        results = members.publish(groups, len(sigs))
    except BulkDispatchError as exc:
        _cancel_unsent(engine, batch_id, groups, exc.unsent)
        raise BulkDispatchError(
            f"batch {batch_id} ({name}): {exc}; the {len(exc.unsent)} members not sent are "
            "counted cancelled",
            enqueued=exc.enqueued,
            uncertain=exc.uncertain,
            unsent=exc.unsent,
            results=exc.results,
        ) from exc
    return Created(batch_id, name, results)


def _cancel_unsent(
    engine: sa.Engine, batch_id: str, groups: list[members.Group], unsent: list[int]
) -> None:
    if not unsent:
        return
    wanted = set(unsent)
    with engine.begin() as conn:
        for index, task_id, task_name in members.task_ids(groups):
            if index in wanted:
                counting.record(conn, batch_id, task_id, "cancelled", task_name=task_name)


def encode_callback(app: Any, which: str, callback: Any, batch_id: str) -> dict[str, str]:
    """The outbox row of a callback, called with the batch id as its first argument (checked
    against the task's signature when this app declares it)."""
    rules.check_batch_callback(which, callback, allowed=CALLBACK_OPTIONS)
    args = (batch_id, *(callback.args or ()))
    kwargs = dict(callback.kwargs or {})
    task = app.tasks.get(callback.task)
    try:
        if task is not None:
            payload = check_arguments(task, args, kwargs)
        else:
            payload = arguments.dumps([list(args), kwargs])
        options = arguments.dumps(dict(callback.options or {}))
    except (TypeError, ValueError, DispatchError) as exc:
        raise DispatchError(
            f"batch {which} ({callback.task}) refused: {exc}; nothing was enqueued"
        ) from exc
    return {"task": callback.task, "payload": payload, "options": options}


def cancel(app: Any, batch_id: str, reason: str) -> bool:
    """Cancel a batch: members not started yet will not run. Whether this call cancelled it
    (False: already cancelled). Raises KeyError for an unknown batch."""
    engine = db.engine_for(app.jobs_settings.database_url)
    with engine.begin() as conn:
        if conn.execute(sa.select(batches.c.id).where(batches.c.id == batch_id)).first() is None:
            raise KeyError(batch_id)
        try:
            # Before the commit: a member that still finds the mark started before it.
            marks.clear(app, batch_id)
        except redis.RedisError as exc:
            raise JobsPlatformError(
                f"batch {batch_id}: the open mark on the coordination Redis cannot be "
                f"deleted ({exc}); nothing was cancelled, try again"
            ) from exc
        return counting.cancel(conn, batch_id, reason)
