"""Objects that must not cross a fork: one per process, created on first use.

Celery's prefork children inherit the parent's memory; a Redis connection pool, a
database engine or a background thread shared across a fork breaks in subtle ways. So
clients are cached under the current PID, and a child builds its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable
from typing import Any, TypeVar, cast

import redis

T = TypeVar("T")

#: Socket timeouts of the platform's own Redis clients (spool, unique-dispatch locks):
#: a half-open Redis must make a call fail in seconds, not hang a worker or a web process.
REDIS_TIMEOUT_S = 5.0

# Re-entrant: a factory may itself ask for another per-process object.
_lock = threading.RLock()
_objects: dict[tuple[int, Hashable], Any] = {}


def per_process(key: Hashable, factory: Callable[[], T]) -> T:
    """The object cached under ``key`` in this process, built by ``factory`` the first time."""
    full_key = (os.getpid(), key)
    with _lock:
        if full_key not in _objects:
            _objects[full_key] = factory()
        return cast(T, _objects[full_key])


def redis_client(url: str) -> redis.Redis:
    """This process's client for the Redis at ``url``, with bounded socket timeouts."""
    return per_process(
        ("redis", url),
        lambda: redis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        ),
    )
