"""The durable spool: a Redis list (coordination) that holds dead letters until stored.

A dead letter is pushed here *before* the database write and removed only after the row
is committed, so a database outage, a crash between the two, or a slow migration loses
nothing: the worker's drainer retries later. Entries are whole JSON documents; removal is
by value (``LREM``), so several drainers may work on the list at once.

With the entry, in the same transaction, goes the job's *dead mark*
(``jobs:dlq:dead:<task id>``, kept :data:`DEAD_MARK_TTL_S`): a later delivery of that job
(its worker died after the letter was stored, so Celery retried it) finds it and is not
run, so no job is ever both dead-lettered and succeeded
(:class:`jobs_platform.cooperative.watchdog.LostAttempts`).
"""

from __future__ import annotations

import redis

from jobs_platform.process_local import redis_client

DEAD_MARK_PREFIX = "jobs:dlq:dead:"
#: How long a dead job's mark is kept: longer than any redelivery can come (the visibility
#: timeout's backstop is an hour by default; a lost worker's retry comes in seconds).
DEAD_MARK_TTL_S = 7 * 86400


def dead_mark_key(task_id: str) -> str:
    return DEAD_MARK_PREFIX + task_id


def unreadable_key(key: str) -> str:
    """Entries of spool ``key`` that are not dead letters at all, set aside."""
    return f"{key}:unreadable"


def rejected_key(key: str) -> str:
    """Entries of spool ``key`` the database refused for good, set aside."""
    return f"{key}:rejected"


def rejected_why_key(key: str) -> str:
    """Why the database refused the entry set aside last (``health`` names it)."""
    return f"{key}:rejected:why"


class Spool:
    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key

    @property
    def client(self) -> redis.Redis:
        return redis_client(self.url)

    def push(self, text: str, *, task_id: str | None = None) -> None:
        """Spool ``text``; with ``task_id``, mark that job dead in the same transaction."""
        if task_id is None:
            self.client.rpush(self.key, text)
            return
        pipe = self.client.pipeline()  # MULTI/EXEC: the entry and the mark together
        pipe.rpush(self.key, text)
        pipe.set(dead_mark_key(task_id), "1", ex=DEAD_MARK_TTL_S)
        pipe.execute()

    def peek(self, count: int) -> list[str]:
        """Up to ``count`` entries, oldest first (they stay in the spool)."""
        items = self.client.lrange(self.key, 0, count - 1)
        return [i.decode() if isinstance(i, bytes) else str(i) for i in items]

    def remove(self, text: str) -> None:
        self.client.lrem(self.key, 1, text)

    def depth(self) -> int:
        return int(self.client.llen(self.key))

    @property
    def unreadable_key(self) -> str:
        return unreadable_key(self.key)

    @property
    def rejected_key(self) -> str:
        return rejected_key(self.key)

    @property
    def rejected_why_key(self) -> str:
        return rejected_why_key(self.key)

    def quarantine(self, text: str) -> None:
        """Move an entry that cannot be parsed aside, so it neither blocks nor vanishes."""
        self._move_aside(self.unreadable_key, text)

    def reject(self, text: str, why: str = "") -> None:
        """Move an entry the database refuses for good (its data, not an outage) aside,
        noting ``why`` (the letter and the database's error) for ``health``."""
        self._move_aside(self.rejected_key, text, (self.rejected_why_key, why[:2000]))

    def _move_aside(self, key: str, text: str, note: tuple[str, str] | None = None) -> None:
        pipe = self.client.pipeline()  # MULTI/EXEC: moved, never copied or dropped
        pipe.rpush(key, text)
        pipe.lrem(self.key, 1, text)
        if note is not None and note[1]:
            pipe.set(*note)
        pipe.execute()
