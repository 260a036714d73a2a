"""The task-events modes, ``auto``, ``on`` and ``off``, and what each means to Celery (pure)."""

from __future__ import annotations

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
