"""The durable spool: a Redis list (coordination) that holds dead letters until stored.

A dead letter is pushed here *before* the database write and removed only after the row
is committed, so a database outage, a crash between the two, or a slow migration loses
nothing: the worker's drainer retries later. Entries are whole JSON documents; removal is
by value (``LREM``), so several drainers may work on the list at once.
"""

from __future__ import annotations

import redis

from jobs_platform.process_local import redis_client


class Spool:
    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key

    @property
    def client(self) -> redis.Redis:
        return redis_client(self.url)

    def push(self, text: str) -> None:
        self.client.rpush(self.key, text)

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
        return f"{self.key}:unreadable"

    @property
    def rejected_key(self) -> str:
        return f"{self.key}:rejected"

    def quarantine(self, text: str) -> None:
        """Move an entry that cannot be parsed aside, so it neither blocks nor vanishes."""
        self._move_aside(self.unreadable_key, text)

    def reject(self, text: str) -> None:
        """Move an entry the database refuses for good (its data, not an outage) aside."""
        self._move_aside(self.rejected_key, text)

    def _move_aside(self, key: str, text: str) -> None:
        pipe = self.client.pipeline()  # MULTI/EXEC: moved, never copied or dropped
        pipe.rpush(key, text)
        pipe.lrem(self.key, 1, text)
        pipe.execute()
