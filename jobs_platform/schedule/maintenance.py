"""The platform's own periodic jobs, run by beat like any other entry.

- ``jobs.maintenance.purge_dead_letters`` (heavy): deletes replayed and discarded dead
  letters that failed more than ``older_than_days`` ago, as ``celery -A APP dlq purge``
  does; rows nobody resolved are kept for a person.
- ``jobs.maintenance.purge_idempotency_keys`` (heavy): deletes idempotency keys past their
  TTL (``JOBS_IDEMPOTENCY_KEY_TTL``); an expired key already counts as never seen, so this
  only reclaims space.
- ``jobs.maintenance.prune_outbox`` (heavy): deletes outbox rows published more than
  ``JOBS_OUTBOX_RETENTION`` ago (a published row is kept only for inspection).
- ``jobs.maintenance.prune_batches`` (heavy): deletes batches settled more than
  ``JOBS_BATCH_RETENTION`` ago, with their members' outcomes.
- ``jobs.maintenance.check_unique_locks`` (fast): counts the unique-dispatch locks. They
  are Redis keys with a TTL (``unique_for``), so Redis removes stale ones itself; the task
  reports how many are held and warns about any without a TTL (the platform makes none).

:func:`install_tasks` declares them on an app (``jobs_platform.schedule.install`` does);
:func:`maintenance_schedule` gives the beat entries to merge into ``beat_schedule``.
SQLAlchemy is imported inside the task bodies: a producer never loads it.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from celery.schedules import crontab

from jobs_platform import coordination
from jobs_platform.clock import utcnow
from jobs_platform.idempotency.unique import LOCK_PREFIX
from jobs_platform.process_local import redis_client
from jobs_platform.profiles import PROFILES

logger = logging.getLogger("jobs_platform.schedule.maintenance")

PURGE_DEAD_LETTERS = "jobs.maintenance.purge_dead_letters"
PURGE_IDEMPOTENCY_KEYS = "jobs.maintenance.purge_idempotency_keys"
CHECK_UNIQUE_LOCKS = "jobs.maintenance.check_unique_locks"
PRUNE_OUTBOX = "jobs.maintenance.prune_outbox"
PRUNE_BATCHES = "jobs.maintenance.prune_batches"
TASK_NAMES = (
    PURGE_DEAD_LETTERS,
    PURGE_IDEMPOTENCY_KEYS,
    CHECK_UNIQUE_LOCKS,
    PRUNE_OUTBOX,
    PRUNE_BATCHES,
)
#: Only rows someone resolved are purged; a row still ``dead`` waits for a person.
PURGED_STATUSES = ("replayed", "discarded")


def maintenance_schedule(settings: Any) -> dict[str, dict[str, Any]]:
    """Beat entries for the maintenance tasks (times in UTC, away from the top of the hour)."""
    days = float(settings.dlq_retention_days)
    return {
        "jobs.maintenance.dlq-retention": {
            "task": PURGE_DEAD_LETTERS,
            "schedule": crontab(minute=15, hour=3),
            "kwargs": {"older_than_days": days},
            "options": {"overlap": "skip", "catch_up": 1},
        },
        "jobs.maintenance.idempotency-keys": {
            "task": PURGE_IDEMPOTENCY_KEYS,
            "schedule": crontab(minute=25),
            "options": {"overlap": "skip", "catch_up": 1},
        },
        "jobs.maintenance.outbox": {
            "task": PRUNE_OUTBOX,
            "schedule": crontab(minute=45),
            "options": {"overlap": "skip", "catch_up": 1},
        },
        "jobs.maintenance.batches": {
            "task": PRUNE_BATCHES,
            "schedule": crontab(minute=50),
            "options": {"overlap": "skip", "catch_up": 1},
        },
        "jobs.maintenance.unique-locks": {
            "task": CHECK_UNIQUE_LOCKS,
            "schedule": crontab(minute=35),
            "options": {"overlap": "skip", "catch_up": 0},
        },
    }


def fitted_limits(settings: Any, queue: str) -> dict[str, Any]:
    """Limits for a maintenance task that fit any app's settings (a test app may set the
    visibility timeout to a few seconds): the queue's profile limit, capped to half the
    budget, and the app's retry waits (which the settings keep within JOBS_MAX_DELAY)."""
    budget = float(settings.visibility_timeout) - float(settings.visibility_margin)
    hard = min(PROFILES[queue].time_limit_s, budget / 2)
    backoff_max = float(settings.retry_backoff_max)
    return {
        "time_limit": hard,
        "soft_time_limit": hard * 0.9,
        "retry_backoff": min(float(settings.retry_backoff), backoff_max),
        "retry_backoff_max": backoff_max,
        "max_retries": 3,
    }


def install_tasks(app: Any) -> None:
    """Declare the maintenance tasks on ``app`` (once; a second call does nothing)."""
    if PURGE_DEAD_LETTERS in app._tasks:  # not .tasks: that would finalize the app
        return
    from jobs_platform.task import ReliableTask

    settings = app.jobs_settings
    for name, queue, run in (
        (PURGE_DEAD_LETTERS, "heavy", purge_dead_letters),
        (PURGE_IDEMPOTENCY_KEYS, "heavy", purge_idempotency_keys),
        (CHECK_UNIQUE_LOCKS, "fast", check_unique_locks),
        (PRUNE_OUTBOX, "heavy", prune_outbox),
        (PRUNE_BATCHES, "heavy", prune_batches),
    ):
        limits = fitted_limits(settings, queue)
        app.task(base=ReliableTask, bind=True, name=name, queue=queue, **limits)(run)


def purge_dead_letters(task: Any, older_than_days: float) -> dict[str, Any]:
    """Delete resolved dead letters that failed more than ``older_than_days`` ago."""
    from jobs_platform.deadletter.store import DeadLetterStore

    if older_than_days <= 0:
        raise ValueError(f"older_than_days must be > 0, got {older_than_days}")
    cutoff = utcnow() - dt.timedelta(days=older_than_days)
    deleted = DeadLetterStore(task.app.jobs_settings.database_url).purge(
        cutoff, statuses=PURGED_STATUSES
    )
    logger.info(
        "jobs.dlq.purged: %d resolved dead letter(s) that failed before %s (retention)",
        deleted,
        cutoff.isoformat(timespec="seconds"),
        extra={"event": "jobs.dlq.purged", "count": deleted, "actor": "beat"},
    )
    return {"deleted": deleted, "before": cutoff.isoformat()}


def purge_idempotency_keys(task: Any) -> dict[str, Any]:
    """Delete idempotency keys past their TTL."""
    from jobs_platform.idempotency.keys import IdempotencyKeys

    deleted = IdempotencyKeys.for_app(task.app).purge_expired()
    logger.info(
        "jobs.keys.purged: %d expired idempotency key(s)",
        deleted,
        extra={"event": "jobs.keys.purged", "count": deleted},
    )
    return {"deleted": deleted}


def prune_outbox(task: Any) -> dict[str, Any]:
    """Delete outbox rows published more than ``JOBS_OUTBOX_RETENTION`` ago."""
    from jobs_platform.db import engine_for
    from jobs_platform.outbox.upkeep import prune

    settings = task.app.jobs_settings
    deleted = prune(engine_for(settings.database_url), float(settings.outbox_retention))
    logger.info(
        "jobs.outbox.pruned: %d published outbox row(s)",
        deleted,
        extra={"event": "jobs.outbox.pruned", "count": deleted},
    )
    return {"deleted": deleted}


def check_unique_locks(task: Any) -> dict[str, Any]:
    """Report the unique-dispatch locks held (Redis expires them itself)."""
    return unique_lock_report(redis_client(coordination.url_of(task.app.jobs_settings)))


def unique_lock_report(client: Any) -> dict[str, Any]:
    """How many unique-dispatch locks are held, and which (if any) have no TTL."""
    held, without_ttl = 0, []
    for key in client.scan_iter(match=LOCK_PREFIX + "*", count=1000):
        held += 1
        if client.ttl(key) == -1:
            without_ttl.append(key.decode() if isinstance(key, bytes) else str(key))
    if without_ttl:
        logger.warning(
            "%d unique-dispatch lock(s) have no TTL and will never expire by themselves: %s",
            len(without_ttl),
            ", ".join(without_ttl[:20]),
            extra={"event": "jobs.unique.no_ttl", "count": len(without_ttl)},
        )
    logger.info(
        "jobs.unique.locks: %d held (each expires with its TTL)",
        held,
        extra={"event": "jobs.unique.locks", "count": held},
    )
    return {"held": held, "without_ttl": without_ttl}


def prune_batches(task: Any) -> dict[str, Any]:
    """Delete batches settled more than ``JOBS_BATCH_RETENTION`` ago."""
    from jobs_platform.batches.state import prune
    from jobs_platform.db import engine_for

    settings = task.app.jobs_settings
    deleted = prune(engine_for(settings.database_url), float(settings.batch_retention))
    logger.info(
        "jobs.batch.pruned: %d settled batch(es)",
        deleted,
        extra={"event": "jobs.batch.pruned", "count": deleted},
    )
    return {"deleted": deleted}
