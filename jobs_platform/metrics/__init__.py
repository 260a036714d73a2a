"""Prometheus metrics, the writing side: counted in every process, summed in Redis (a leaf:
features write through it, it reads nothing back).

::

    names.py      every metric: name, type, labels, help, where it comes from   (pure)
    keys.py       the Redis keys the counts are written to                       (pure)
    counters.py   the per-process buffer flushed to Redis; prometheus-client-shaped
                  counters for the platform's own code                         (Redis)
    outcomes.py   task outcomes from Celery signals (no task events)           (Celery)
    bootstep.py   turns recording on in a worker, reports it alive             (Celery)

:func:`install` wires it into an app (:func:`jobs_platform.create_app` calls it). The
reading side, ``celery -A APP metrics``, is :mod:`jobs_platform.exporter`
(docs/metrics.md).
"""

from __future__ import annotations

from typing import Any

from jobs_platform import coordination
from jobs_platform.metrics import counters, outcomes

#: The worker bootstep (a string: only workers import it).
BOOTSTEP = "jobs_platform.metrics.bootstep:MetricsStep"

__all__ = ["BOOTSTEP", "activate", "install"]


def install(app: Any) -> None:
    """Add the recording bootstep to ``app``'s workers and connect the outcome receivers."""
    app.steps["worker"].add(BOOTSTEP)
    outcomes.connect()


def activate(app: Any) -> None:
    """Record this process's counts too (a producer: unique-dispatch duplicates skipped).

    Workers do it by themselves; a web process that wants its counts in the fleet's
    totals calls this once after ``create_app``.
    """
    counters.activate(
        coordination.url_of(app.jobs_settings),
        interval_s=counters.flush_interval(app.jobs_settings),
    )
