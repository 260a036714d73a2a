"""Prometheus metrics: counted in the workers, summed in Redis, served by ``celery -A APP
metrics`` (docs/metrics.md).

::

    names.py      every metric: name, type, labels, help, where it comes from   (pure)
    keys.py       every Redis key the metrics read or write                     (pure)
    counters.py   the per-process buffer flushed to Redis; prometheus-client-shaped
                  counters for the platform's own code                         (Redis)
    outcomes.py   task outcomes from Celery signals (no task events)           (Celery)
    bootstep.py   turns recording on in a worker, reports it alive             (Celery)
    queues.py     kombu's Redis structures read at a flat cost                 (Redis)
    collector.py  the scrape-time collector: Redis, the dead-letter table      (Redis, SQLAlchemy)
    exporter.py   the HTTP server                                              (prometheus-client)

:func:`install` wires it into an app (:func:`jobs_platform.create_app` calls it); it loads
neither the collector nor SQLAlchemy.
"""

from __future__ import annotations

from typing import Any

from jobs_platform import coordination

#: The worker bootstep (a string: only workers import it).
BOOTSTEP = "jobs_platform.metrics.bootstep:MetricsStep"

__all__ = ["BOOTSTEP", "activate", "install"]


def install(app: Any) -> None:
    """Add the recording bootstep to ``app``'s workers and connect the outcome receivers."""
    from jobs_platform.metrics import outcomes

    app.steps["worker"].add(BOOTSTEP)
    outcomes.connect()


def activate(app: Any) -> None:
    """Record this process's counts too (a producer: unique-dispatch duplicates skipped).

    Workers do it by themselves; a web process that wants its counts in the fleet's
    totals calls this once after ``create_app``.
    """
    from jobs_platform.metrics import counters

    counters.activate(
        coordination.url_of(app.jobs_settings),
        interval_s=counters.flush_interval(app.jobs_settings),
    )
