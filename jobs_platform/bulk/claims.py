"""Unique dispatch for a bulk: every lock taken in one round trip, freed in one.

The same atomic script per job as :func:`jobs_platform.idempotency.unique.dispatch_once`
(``SET NX PX``, else read the holder), run in one pipeline: Redis runs them in order, so
two calls of one logical job in the same bulk behave as two ``.delay()`` calls in a row
(the second gets the first one's id).
"""

from __future__ import annotations

import logging
from typing import Any

from jobs_platform.bulk.calls import Call
from jobs_platform.idempotency import events, unique

logger = logging.getLogger("jobs_platform.bulk")


def claim(task: Any, calls: list[Call]) -> dict[int, str]:
    """Take the lock of each call with an identity; ``{index: holder}`` for those whose job
    is already queued or running (as another id), i.e. the calls not to publish."""
    locked = [call for call in calls if call.identity is not None]
    if not locked:
        return {}
    locks = unique.locks_for(task.app.conf.broker_url)
    ttl_ms = max(1, int(task.spec.unique_for_s * 1000))
    pipe = locks.client.pipeline(transaction=False)
    for call in locked:
        # UniqueLocks.acquire's own script object, queued instead of run.
        locks._acquire(
            keys=[unique.LOCK_PREFIX + str(call.identity)], args=[call.task_id, ttl_ms], client=pipe
        )
    held: dict[int, str] = {}
    for call, (holder, _acquired) in zip(locked, pipe.execute(), strict=True):
        text = holder.decode() if isinstance(holder, bytes) else str(holder)
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


def release(task: Any, calls: list[Call]) -> None:
    """Free the locks these calls took (their jobs may not be queued); best effort: the
    lock's TTL (``unique_for``) frees it anyway."""
    locked = [call for call in calls if call.identity is not None]
    if not locked:
        return
    try:
        locks = unique.locks_for(task.app.conf.broker_url)
        pipe = locks.client.pipeline(transaction=False)
        for call in locked:
            locks._release(
                keys=[unique.LOCK_PREFIX + str(call.identity)], args=[call.task_id], client=pipe
            )
        pipe.execute()
    except Exception:
        logger.warning(
            "%s: could not free %d unique-dispatch locks; they expire after unique_for",
            task.name,
            len(locked),
            exc_info=True,
            extra={"event": "jobs.unique.release_failed", "task_name": task.name},
        )
