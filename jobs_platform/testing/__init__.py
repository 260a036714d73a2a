"""Testing helpers for apps built on jobs-platform, with real processes and no Docker.

- :mod:`.processes`: ``WorkerProcess`` (a real ``celery worker``, killable), ``workers``,
  ``RedisServer`` (a private redis-server), ``wait_for`` (poll with a deadline),
  ``free_port``, ``port_answers``.
- :mod:`.redis_db`: a Redis database of a test session's own.
- :mod:`.letters`: ``dead_letter(**overrides)`` (a ``DeadLetter`` factory) and
  ``assert_dead_lettered(app, task_id, reason=...)``.
- :mod:`.versions`: ``assert_versions_locked(app, path)`` (the versions lock check).
- :mod:`.clock`: ``FakeClock``, for the objects that take a clock.
- :mod:`.plugin`: the pytest fixtures (``jobs_worker``, ``jobs_env``, ``jobs_clock``, ...),
  registered by the ``pytest11`` entry point. See docs/testing.md.
"""

from jobs_platform.testing.clock import FakeClock
from jobs_platform.testing.letters import assert_dead_lettered, dead_letter
from jobs_platform.testing.processes import (
    RedisServer,
    WorkerProcess,
    free_port,
    port_answers,
    wait_for,
    workers,
)
from jobs_platform.testing.versions import assert_versions_locked

__all__ = [
    "FakeClock",
    "RedisServer",
    "WorkerProcess",
    "assert_dead_lettered",
    "assert_versions_locked",
    "dead_letter",
    "free_port",
    "port_answers",
    "wait_for",
    "workers",
]
