"""Objects that must not cross a fork: one per process, created on first use.

Celery's prefork children inherit the parent's memory; a Redis connection pool, a
database engine or a background thread shared across a fork breaks in subtle ways. So
objects are cached under the current PID, and a child builds its own. A child calls
:func:`forget_inherited` when it starts (``worker_process_init``): the copies it inherited
are released (an engine drops its pool without closing the parent's connections) and
forgotten.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import redis

from jobs_platform import redis_urls

T = TypeVar("T")

#: Socket timeouts of the platform's own Redis clients (spool, unique-dispatch locks):
#: a half-open Redis must make a call fail in seconds, not hang a worker or a web process.
REDIS_TIMEOUT_S = 5.0

# Re-entrant: a factory may itself ask for another per-process object.
_lock = threading.RLock()
#: (pid, key) -> (object, how to release it in a child that inherited it, or None).
_objects: dict[tuple[int, Hashable], tuple[Any, Callable[[Any], None] | None]] = {}


def per_process(
    key: Hashable, factory: Callable[[], T], *, release: Callable[[T], None] | None = None
) -> T:
    """The object cached under ``key`` in this process, built by ``factory`` the first time.

    ``release(obj)`` is called by :func:`forget_inherited` in a child that inherited it.
    """
    full_key = (os.getpid(), key)
    entry = _objects.get(full_key)  # the usual case, without the lock
    if entry is None:
        with _lock:
            entry = _objects.get(full_key)
            if entry is None:
                entry = (factory(), cast(Callable[[Any], None] | None, release))
                _objects[full_key] = entry
    return cast(T, entry[0])


def forget_inherited() -> None:
    """Release and forget every object built by another process (call in a forked child)."""
    pid = os.getpid()
    with _lock:
        inherited = [key for key in _objects if key[0] != pid]
        for key in inherited:
            obj, release = _objects.pop(key)
            if release is not None:
                release(obj)


def _reinit_lock_in_child() -> None:
    # Another thread of the parent (the delayed releaser, the dead-letter drainer) may have
    # been inside per_process() when the pool forked: that thread does not exist here, so
    # the inherited lock would stay held for ever and forget_inherited() would hang the
    # child in worker_process_init. Its half-built object is not in _objects (assigned last).
    global _lock
    _lock = threading.RLock()


os.register_at_fork(after_in_child=_reinit_lock_in_child)


#: Longest a fork waits for background threads to leave the database (then it goes ahead).
FORK_WAIT_S = 10.0


class ForkGate:
    """Keeps forks out of the moments a background thread is inside the database driver.

    A thread inside SQLite (or libpq, or a name lookup) holds C-level mutexes that Python
    does not know about. Forked at that moment, the child inherits them locked and hangs
    for ever at its first use of the library: a prefork pool process that stores a dead
    letter in SQLite hung until its hard time limit while the parent's outbox relay was
    polling the same file (45 children of 300 in a loop that forks beside such a thread,
    none with the gate). The worker's own threads (dead-letter drainer, outbox relay) pass
    through :meth:`passage` for each database pass, and a fork waits until none is inside,
    at most :data:`FORK_WAIT_S`, holding new passages back meanwhile.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self._forking = False

    @contextmanager
    def passage(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._forking)
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    def before_fork(self) -> None:
        self._cond.acquire()  # held across the fork: no passage starts meanwhile
        self._forking = True
        self._cond.wait_for(lambda: self._inside == 0, timeout=FORK_WAIT_S)

    def after_fork_in_parent(self) -> None:
        self._forking = False
        self._cond.notify_all()
        self._cond.release()


_gate = ForkGate()


def _gate_after_fork_in_child() -> None:
    global _gate
    _gate = ForkGate()  # the parent's threads are not here; nothing is inside


os.register_at_fork(
    before=lambda: _gate.before_fork(),
    after_in_parent=lambda: _gate.after_fork_in_parent(),
    after_in_child=_gate_after_fork_in_child,
)


@contextmanager
def fork_safe() -> Iterator[None]:
    """A background thread's database pass: no fork of this process happens inside it."""
    with _gate.passage():
        yield


def redis_client(url: str) -> redis.Redis:
    """This process's client for the Redis at ``url``, with bounded socket timeouts (for a
    ``sentinel://`` URL, a client of the master that follows a failover:
    :mod:`jobs_platform.redis_urls`)."""
    return per_process(
        ("redis", url),
        lambda: redis_urls.client(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        ),
    )
