"""The three queue classes and the router that sends each task to exactly one of them.

* ``fast``: short, latency-sensitive work (emails, cache updates): many slots, short limits.
* ``heavy``: CPU/memory-heavy work (images, reports): one process per core, long limits.
* ``thirdparty``: calls to partner APIs: I/O-bound, isolated so a slow partner cannot
  starve the other queues.

Queues are declared explicitly and ``task_create_missing_queues`` is off, so a typo in
a queue name is an error instead of a new queue that no worker consumes.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from jobs_platform.errors import ConfigError

QUEUE_NAMES: tuple[str, ...] = ("fast", "heavy", "thirdparty")


def check_queue(queue: object, *, what: str) -> str:
    """``queue`` if it is one of :data:`QUEUE_NAMES`; else ConfigError naming ``what``."""
    if queue not in QUEUE_NAMES:
        raise ConfigError(
            f"{what}: unknown queue {queue!r}; the known queues are {', '.join(QUEUE_NAMES)}"
        )
    return str(queue)


class Router:
    """Celery ``task_routes`` entry: declared task queues first, then the glob table (data).

    Explicit ``apply_async(queue=...)`` still wins (Celery merges it over the route).
    """

    def __init__(self, table: Mapping[str, str]) -> None:
        self.table = dict(table)
        self.declared: dict[str, str] = {}

    def declare(self, task_name: str, queue: str) -> None:
        self.declared[task_name] = check_queue(queue, what=f"task {task_name!r}")

    def queue_for(self, task_name: str) -> str | None:
        if task_name in self.declared:
            return self.declared[task_name]
        for pattern, queue in self.table.items():
            if fnmatch.fnmatchcase(task_name, pattern):
                return queue
        return None

    def __call__(
        self, name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any
    ) -> dict[str, str] | None:
        queue = self.queue_for(name)
        return {"queue": queue} if queue else None
