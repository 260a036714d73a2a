"""One worker profile per queue class: pool, concurrency, prefetch, recycling, time limits.

Each profile is data; :func:`worker_argv` turns it into the exact ``celery worker`` command
(``celery -A tasks worker-profile fast --print`` shows it). Time limits are per profile and
are applied to each task at declaration, so they are pinned in code, not in worker flags.
"""

from __future__ import annotations

import dataclasses
import os

from jobs_platform.routing import check_queue


@dataclasses.dataclass(frozen=True)
class WorkerProfile:
    queue: str
    pool: str  # prefork | threads | solo
    concurrency: int
    prefetch_multiplier: int
    max_tasks_per_child: int | None
    soft_time_limit_s: float
    time_limit_s: float
    why: str


PROFILES: dict[str, WorkerProfile] = {
    "fast": WorkerProfile(
        queue="fast",
        pool="prefork",
        concurrency=4,
        prefetch_multiplier=1,
        max_tasks_per_child=None,
        soft_time_limit_s=25,
        time_limit_s=30,
        why="Short I/O-light work: two processes per core overlap short waits; prefork because "
        "only it enforces hard time limits (threads measured no faster, see `make bench`).",
    ),
    "heavy": WorkerProfile(
        queue="heavy",
        pool="prefork",
        concurrency=max(1, os.cpu_count() or 1),
        prefetch_multiplier=1,
        max_tasks_per_child=100,
        soft_time_limit_s=540,
        time_limit_s=600,
        why="CPU-bound work: one process per core, prefetch 1 so a long job never holds a "
        "second one hostage, children recycled to return leaked memory.",
    ),
    "thirdparty": WorkerProfile(
        queue="thirdparty",
        pool="prefork",
        concurrency=8,
        prefetch_multiplier=1,
        max_tasks_per_child=None,
        soft_time_limit_s=50,
        time_limit_s=60,
        why="Partner APIs: slow I/O, so more processes than cores; isolated so a slow partner "
        "fills only its own slots; prefork so a hung call is killed at the hard limit.",
    ),
}


def worker_argv(
    app: str, queue: str, *, hostname: str | None = None, loglevel: str = "INFO"
) -> list[str]:
    """The ``celery worker`` command line for ``queue``'s profile."""
    profile = PROFILES[check_queue(queue, what="worker profile")]
    # fmt: off
    argv = [
        "celery", "-A", app, "worker",
        "-Q", profile.queue,
        "-P", profile.pool,
        "-c", str(profile.concurrency),
        "--prefetch-multiplier", str(profile.prefetch_multiplier),
        "-n", hostname or f"{profile.queue}@%h",
        "-l", loglevel,
        # Gossip/mingle/heartbeat cost start-up time and broker traffic and give us nothing:
        # monitoring reads events, and redelivery is the broker's job.
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    # fmt: on
    if profile.max_tasks_per_child:
        argv += ["--max-tasks-per-child", str(profile.max_tasks_per_child)]
    return argv
