"""A batch's open mark on the coordination Redis: the cheap answer to "is it cancelled?".

Every member asks before its body, so the question is on the hot path (an SQL read per
member cost more CPU than the member's no-op body). SQL stays the truth (``cancelled_at``,
what ``batch show`` reads); the mark only lets a member skip the read:

- ``batch()`` sets ``jobs:batch:open:<id>`` after committing the batch row, before the
  first member is published (a failure to set it is ignored: members then ask SQL);
- a member that finds the mark runs without asking SQL; one that does not find it (no mark,
  expired, Redis unreachable or flushed) asks SQL, as before the mark existed;
- ``cancel`` deletes the mark **before** it commits ``cancelled_at``, and refuses (nothing
  cancelled) when it cannot: a member that still saw the mark was past its check before
  the cancel committed, as a member already running is.

So a lost mark costs a read, never a cancel. The one thing that could bring a deleted mark
back is a Redis restored from a snapshot taken before the cancel (docs/batches.md, Limits).
The mark expires after :data:`TTL_S` (members of older batches ask SQL).
"""

from __future__ import annotations

import logging
from typing import Any

import redis

from jobs_platform import coordination

logger = logging.getLogger("jobs_platform.batches")

PREFIX = "jobs:batch:open:"
#: Long enough for the members of a batch dispatched at once; later ones (delayed, retried
#: past it, replayed) ask SQL.
TTL_S = 24 * 3600


def key(batch_id: str) -> str:
    return f"{PREFIX}{batch_id}"


def mark_open(app: Any, batch_id: str) -> None:
    """Set the open mark (best effort: without it the members ask SQL)."""
    try:
        coordination.client(app).set(key(batch_id), 1, ex=TTL_S)
    except redis.RedisError as exc:
        logger.warning(
            "batch %s: open mark not set (%s); its members will ask SQL",
            batch_id,
            exc,
            extra={"event": "jobs.batch.mark_not_set"},
        )


def is_open(app: Any, batch_id: str) -> bool:
    """True when the mark says the batch is not cancelled; False means "ask SQL"."""
    try:
        return bool(coordination.client(app).exists(key(batch_id)))
    except redis.RedisError:
        return False


def clear(app: Any, batch_id: str) -> None:
    """Delete the mark (before a cancel commits); raises ``redis.RedisError`` when it cannot."""
    coordination.client(app).delete(key(batch_id))
