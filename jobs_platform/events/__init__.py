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
"""

from __future__ import annotations

from typing import Any

from jobs_platform.errors import ConfigError

AUTO, ON, OFF = "auto", "on", "off"
MODES = (AUTO, ON, OFF)
#: The old boolean spellings (``JOBS_TASK_EVENTS=0`` and friends) still work.
_SPELLINGS = {
    **{mode: mode for mode in MODES},
    **dict.fromkeys(("true", "1", "yes"), ON),
    **dict.fromkeys(("false", "0", "no"), OFF),
}
#: How often Flower 2.2 broadcasts ``enable_events`` (``flower.events.Events``, fixed there).
FLOWER_INTERVAL_S = 5.0
#: The consumer bootstep (a string: only workers import it).
BOOTSTEP = "jobs_platform.events.lease:TaskEventsLease"


def parse_mode(value: object, *, setting: str = "JOBS_TASK_EVENTS") -> str:
    """``auto``, ``on`` or ``off`` from a mode, a bool, or a boolean spelling."""
    if isinstance(value, bool):
        return ON if value else OFF
    if isinstance(value, str) and value.strip().lower() in _SPELLINGS:
        return _SPELLINGS[value.strip().lower()]
    raise ConfigError(
        f"{setting}={value!r} is not a task-events mode: use auto (on while a monitor such "
        "as Flower asks for them), on or off (true/false, 1/0, yes/no also work)"
    )


def celery_config(mode: str) -> dict[str, bool]:
    """The Celery settings a worker and a producer start with in ``mode``."""
    on = mode == ON
    # task-sent is sent by the producer, which cannot know whether a monitor listens: in
    # auto mode a monitor sees a task from the moment a worker receives it.
    return {"worker_send_task_events": on, "task_send_sent_event": on}


def flower_enables_events(mode: str) -> bool:
    """Whether Flower broadcasts ``enable_events``: not when the workers refuse it."""
    return mode != OFF


def install(app: Any) -> None:
    """Give ``app``'s workers the mode's control commands and the lease bootstep."""
    from jobs_platform.events import lease

    lease.register_commands()
    app.steps["consumer"].add(BOOTSTEP)
