"""When a running job has outlived what its pool can enforce (pure: no Celery, no Redis)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

#: Pools that stop a task at its hard limit cooperatively (where it yields): they need the
#: watchdog. (Prefork kills the child process instead; threads and solo are refused.)
COOPERATIVE_POOLS = frozenset({"gevent"})
#: The grace after a hard limit is half the visibility margin, at most this many seconds:
#: gevent's Timeout normally lands within milliseconds, so a longer wait proves nothing.
MAX_GRACE_S = 5.0
#: A worker the watchdog ended exits with this status (EX_TEMPFAIL: restart it).
EXIT_STATUS = 75
#: How long a lost-attempt mark waits for the redelivery (beyond the visibility timeout).
LOST_MARK_TTL_S = 86400
LOST_KEY_PREFIX = "jobs:watchdog:lost:"
#: kombu's Redis channel opens at most 10 connections by default (``max_connections``).
KOMBU_MAX_CONNECTIONS = 10
#: Connections beyond one per greenlet: the consumer's, the restore sweep's, the events'.
CONNECTION_HEADROOM = 10


@dataclasses.dataclass(frozen=True)
class Running:
    """A job the worker is running: since when (wall clock, seconds) and its hard limit."""

    task_id: str
    name: str
    started_at: float
    hard_limit_s: float | None


def grace_for(margin_s: float) -> float:
    """Seconds a job may run past its hard limit before the worker is ended.

    Within the visibility margin (hard limit < visibility timeout - margin is checked at
    declaration), so the worker is gone before the broker hands the message to another.
    """
    if margin_s <= 0:
        raise ValueError(f"the visibility margin must be > 0 s, got {margin_s}")
    return min(MAX_GRACE_S, margin_s / 2)


def tick_for(grace_s: float) -> float:
    """How often the watchdog looks: often enough that its own delay stays within the grace."""
    return min(1.0, grace_s / 2)


def deadline(job: Running, *, grace_s: float, budget_s: float) -> float:
    """When ``job`` must be over: its hard limit + grace, or the visibility budget (visibility
    timeout - margin) for a job without a hard limit (a plain Celery task)."""
    if job.hard_limit_s is None or job.hard_limit_s <= 0:
        return job.started_at + budget_s
    return job.started_at + job.hard_limit_s + grace_s


def overdue(
    jobs: Iterable[Running], *, now: float, grace_s: float, budget_s: float
) -> list[Running]:
    """The jobs still running past their deadline, oldest first."""
    late = [j for j in jobs if now > deadline(j, grace_s=grace_s, budget_s=budget_s)]
    return sorted(late, key=lambda j: j.started_at)


def broker_connections(concurrency: int, configured: int | None) -> int:
    """The broker connection pool a cooperative worker needs: every greenlet may ack at the
    same moment, and an ack that finds the pool full fails ("Couldn't ack ... Too many
    connections", celery/celery#1350), leaving the message to run again after the
    visibility timeout."""
    return max(configured or KOMBU_MAX_CONNECTIONS, concurrency + CONNECTION_HEADROOM)


def lost_key(task_id: str) -> str:
    """The broker key that marks ``task_id``'s attempt as lost with its worker."""
    return f"{LOST_KEY_PREFIX}{task_id}"


def describe(jobs: Iterable[Running], *, now: float) -> str:
    return ", ".join(
        f"{j.name}[{j.task_id}] running {now - j.started_at:.1f} s "
        f"(hard limit {j.hard_limit_s if j.hard_limit_s is not None else 'none'})"
        for j in jobs
    )
