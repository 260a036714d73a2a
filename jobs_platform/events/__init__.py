"""Task events only while a monitor listens (``JOBS_TASK_EVENTS``).

Task events cost about 0.8 ms of worker CPU per task (docs/benchmarks.md), and only a
monitor reads them. The mode decides when a worker sends them:

- ``auto`` (the default): off at start; a worker switches them on when it receives Celery's
  ``enable_events`` control broadcast (Flower sends it every 5 s while it runs) and off
  again, through Celery's own ``disable_events``, once none has arrived for
  ``JOBS_TASK_EVENTS_LEASE`` seconds (:mod:`.lease`);
- ``on``: always on, ``disable_events`` refused;
- ``off``: never, ``enable_events`` refused.

Worker events (heartbeats, online/offline) go out as Celery decides in every mode: they keep
Flower's worker list right. Metrics come from signals, not events (:mod:`jobs_platform.metrics`).

::

    modes.py   the modes and what each means to Celery's settings       (pure)
    lease.py   the worker side: enable_events renews a lease            (Celery)
"""

from __future__ import annotations

from typing import Any

from jobs_platform.events.modes import (
    AUTO,
    FLOWER_INTERVAL_S,
    MODES,
    OFF,
    ON,
    celery_config,
    flower_enables_events,
    parse_mode,
)

#: The consumer bootstep (a string: only workers import it).
BOOTSTEP = "jobs_platform.events.lease:TaskEventsLease"

__all__ = [
    "AUTO",
    "BOOTSTEP",
    "FLOWER_INTERVAL_S",
    "MODES",
    "OFF",
    "ON",
    "celery_config",
    "flower_enables_events",
    "install",
    "parse_mode",
]


def install(app: Any) -> None:
    """Give ``app``'s workers the mode's control commands and the lease bootstep."""
    # Worker-side (Celery's control panel): loaded when an app is made, not at import.
    from jobs_platform.events import lease

    lease.register_commands()
    app.steps["consumer"].add(BOOTSTEP)
