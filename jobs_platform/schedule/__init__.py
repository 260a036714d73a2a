"""Recurring jobs: Celery's ``beat_schedule``, sent once per slot by a highly available beat.

::

    scheduler.py    the beat Scheduler: leader, due slots, record-then-send    (Celery, Redis)
    leader.py       the leader lock (SET NX PX, extended every tick)           (Redis)
    slots.py        slot arithmetic (pure) and the per-slot record (SET NX)    (Redis)
    policies.py     overlap and catch-up policies, which due slots to send     (pure)
    running.py      the overlap marker; worker receivers that extend/clear it  (Celery, Redis)
    state.py        shared progress, last tick per entry, skip counts          (Redis)
    maintenance.py  the platform's own periodic tasks and their beat entries   (Celery)
    metrics.py      Prometheus counters

An app made by :func:`jobs_platform.create_app` merges :func:`celery_config` into its
configuration (so ``celery -A APP beat`` runs :class:`~.scheduler.Scheduler`) and calls
:func:`install` (worker receivers, maintenance tasks). See docs/recurring-jobs.md.
"""

from __future__ import annotations

from typing import Any

from jobs_platform.schedule.maintenance import maintenance_schedule
from jobs_platform.schedule.policies import EntryPolicy
from jobs_platform.schedule.slots import ENTRY_HEADER, SLOT_HEADER

#: ``beat_scheduler`` of apps made by create_app (a string: only beat imports it).
SCHEDULER = "jobs_platform.schedule.scheduler:Scheduler"

__all__ = [
    "ENTRY_HEADER",
    "SCHEDULER",
    "SLOT_HEADER",
    "EntryPolicy",
    "celery_config",
    "install",
    "maintenance_schedule",
]


def celery_config(settings: Any) -> dict[str, Any]:
    """The Celery configuration keys for the platform's beat (merge into the app's)."""
    return {
        "beat_scheduler": SCHEDULER,
        # A slot is sent at most this late; a standby checks the leader lock this often.
        "beat_max_loop_interval": float(settings.beat_loop_interval),
    }


def install(app: Any) -> None:
    """Connect the overlap-marker receivers and declare the maintenance tasks on ``app``."""
    from celery import signals

    from jobs_platform.schedule import maintenance, metrics, running

    running.connect_receivers()
    maintenance.install_tasks(app)
    signals.beat_init.connect(metrics.on_beat_init, weak=False, dispatch_uid="jobs.beat.metrics")
