"""One worker profile per queue class: pool, concurrency, prefetch, recycling, time limits.

Each profile is data; :func:`worker_argv` turns it into the exact ``celery worker`` command
(``celery -A tasks worker-profile fast --print`` shows it). Time limits are per profile and
are applied to each task at declaration, so they are pinned in code, not in worker flags.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from pathlib import Path

from jobs_platform.routing import check_queue


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may really use: the affinity mask, capped by a cgroup CPU quota.

    ``os.cpu_count()`` is the host's count; in a container limited to 2 CPUs on a 64-core
    host it would start 64 heavy processes that then fight over 2 CPUs.
    """
    count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = _cgroup_quota(cgroup_root)
    if quota is not None:
        count = min(count or 1, max(1, math.ceil(quota)))
    return max(1, count or 1)


def _cgroup_quota(root: Path) -> float | None:
    """The CPU quota in CPUs (cgroup v2 ``cpu.max``, else v1 cfs files), or None if unlimited."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us


@dataclasses.dataclass(frozen=True)
class WorkerProfile:
    queue: str
    pool: str  # prefork | gevent
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
        concurrency=available_cpus(),
        prefetch_multiplier=1,
        max_tasks_per_child=100,
        soft_time_limit_s=540,
        time_limit_s=600,
        why="CPU-bound work: one process per core, prefetch 1 so a long job never holds a "
        "second one hostage, children recycled to return leaked memory.",
    ),
    "thirdparty": WorkerProfile(
        queue="thirdparty",
        pool="gevent",
        concurrency=100,
        prefetch_multiplier=1,
        max_tasks_per_child=None,
        soft_time_limit_s=50,
        time_limit_s=60,
        why="Partner APIs: calls that mostly wait, so 100 cooperative greenlets in one process "
        "(gevent) instead of a process per call; isolated so a slow partner fills only its "
        "own slots. A call that yields is stopped at the hard limit (gevent.Timeout); code "
        "that never yields is caught by the watchdog, which ends the worker.",
    ),
}


#: ``celery worker`` options a profile decides; passing them through would contradict it.
PROFILE_OPTIONS = frozenset({"-Q", "--queues", "-P", "--pool", "--prefetch-multiplier"})


def worker_argv(
    app: str,
    queue: str,
    *,
    hostname: str | None = None,
    loglevel: str = "INFO",
    concurrency: int | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The ``celery worker`` command line for ``queue``'s profile.

    ``app`` is the ``-A`` value exactly as the user gave it (a module path such as
    ``myproj.jobs``); ``extra`` options go through to ``celery worker`` unchanged.
    """
    profile = PROFILES[check_queue(queue, what="worker profile")]
    clashing = sorted({arg.split("=", 1)[0] for arg in extra} & PROFILE_OPTIONS)
    if clashing:
        raise ValueError(
            f"{', '.join(clashing)}: the {queue!r} profile decides the queue, pool and "
            "prefetch; start another profile or change the profile instead"
        )
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    extra_flags = list(extra)
    if profile.max_tasks_per_child:
        extra_flags = ["--max-tasks-per-child", str(profile.max_tasks_per_child), *extra_flags]
    return celery_worker_argv(
        app,
        [profile.queue],
        pool=profile.pool,
        concurrency=concurrency or profile.concurrency,
        prefetch_multiplier=profile.prefetch_multiplier,
        hostname=hostname or f"{profile.queue}@%h",
        loglevel=loglevel,
        extra=extra_flags,
    )


def celery_worker_argv(
    app: str,
    queues: Sequence[str],
    *,
    pool: str,
    concurrency: int,
    prefetch_multiplier: int,
    hostname: str,
    loglevel: str = "INFO",
    extra: Sequence[str] = (),
) -> list[str]:
    """The one place a ``celery worker`` command line is spelt (profiles and tests use it)."""
    # fmt: off
    return [
        "celery", "-A", app, "worker",
        "-Q", ",".join(queues),
        "-P", pool,
        "-c", str(concurrency),
        "--prefetch-multiplier", str(prefetch_multiplier),
        "-n", hostname,
        "-l", loglevel,
        # Gossip and mingle cost start-up time and broker traffic and give us nothing
        # (redelivery is the broker's job). Heartbeats stay on: without them Flower shows an
        # idle worker offline after its expiry window (docs/flower.md measures their cost).
        "--without-gossip", "--without-mingle",
        *extra,
    ]
    # fmt: on
