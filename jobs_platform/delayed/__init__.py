"""Delays of any length: what a countdown, an ETA or a retry wait means on the platform.

Any dispatch may ask to run later, up to ``JOBS_MAX_DELAY`` (30 days; refused beyond it at
dispatch, :func:`jobs_platform.rules.check_dispatch_delay`), and the job runs once when it
is due, whatever happens to workers meanwhile. How the wait is kept is the broker's
business: on Redis a wait that does not fit beside the run in the visibility timeout waits
in a durable store on the broker, released by every worker
(:mod:`jobs_platform.brokers.redis.delayed`, docs/delayed-jobs.md).

::

    control.py    revoke that also cancels a waiting job                    (Celery)

``celery -A APP delayed list|show|cancel`` (:mod:`jobs_platform.cli.delayed`) is the
store's face for people; :func:`cancel_delayed` is what it and revoke call.
"""

from __future__ import annotations

from typing import Any

from jobs_platform import brokers

__all__ = ["cancel_delayed", "store_of"]


def store_of(app: Any) -> Any:
    """``app``'s store of waiting jobs, or ``None`` when its broker delays messages itself."""
    return brokers.of(app).delayed_store(app)


def cancel_delayed(app: Any, task_id: str) -> Any:
    """Remove ``task_id`` from ``app``'s store; the job removed, or ``None`` if not delayed
    (never stored, already released, already cancelled, or a broker without a store)."""
    store = store_of(app)
    return None if store is None else store.cancel(task_id)
