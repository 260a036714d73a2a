"""Unique dispatch for a bulk: every lock taken in one round trip, freed in one.

The same atomic script per job as :func:`jobs_platform.idempotency.unique.dispatch_once`
(``SET NX PX``, else read the holder), run in one pipeline (``UniqueLocks.acquire_many``):
Redis runs them in order, so two calls of one logical job in the same bulk behave as two
``.delay()`` calls in a row (the second gets the first one's id).
"""

from __future__ import annotations

import logging
from typing import Any

from jobs_platform import coordination
from jobs_platform.bulk.calls import Call
from jobs_platform.idempotency import events, unique

logger = logging.getLogger("jobs_platform.bulk")


def claim(task: Any, calls: list[Call]) -> dict[int, str]:
    """Take the lock of each call with an identity; ``{index: holder}`` for those whose job
    is already queued or running (as another id), i.e. the calls not to publish."""
    locked = [call for call in calls if call.identity is not None]
    if not locked:
        return {}
    holders = unique.locks_for(coordination.url_of(task.app.jobs_settings)).acquire_many(
        [(str(call.identity), call.task_id) for call in locked],
        unique.pending_s(task.app.jobs_settings, task.spec.unique_for_s),
    )
    held: dict[int, str] = {}
    for call, text in zip(locked, holders, strict=True):
        if text != call.task_id:
            held[call.index] = text
            events.skipped(
                task.name,
                "unique",
                "%s: %s is already queued or running as %s",
                task.name,
                call.identity,
                text,
            )
    return held


def confirm(task: Any, calls: list[Call]) -> None:
    """These calls are published: their locks live ``unique_for`` from now."""
    locked = [(str(call.identity), call.task_id) for call in calls if call.identity is not None]
    if locked:
        locks = unique.locks_for(coordination.url_of(task.app.jobs_settings))
        locks.confirm_many(locked, task.spec.unique_for_s)


def release(task: Any, calls: list[Call]) -> None:
    """Free the locks these calls took (their jobs may not be queued); best effort: the
    lock's TTL (``unique_for``) frees it anyway."""
    locked = [call for call in calls if call.identity is not None]
    if not locked:
        return
    try:
        unique.locks_for(coordination.url_of(task.app.jobs_settings)).release_many(
            [(str(call.identity), call.task_id) for call in locked]
        )
    except Exception:
        logger.warning(
            "%s: could not free %d unique-dispatch locks; they expire after unique_for",
            task.name,
            len(locked),
            exc_info=True,
            extra={"event": "jobs.unique.release_failed", "task_name": task.name},
        )
