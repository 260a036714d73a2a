"""The worker side of ``JOBS_TASK_EVENTS``: task events on lease from a listening monitor.

A monitor that wants task events says so with Celery's ``enable_events`` control broadcast;
Flower repeats it every 5 s for as long as it runs (its ``enable_events`` option). In
``auto`` mode each broadcast renews a lease; a timer on the consumer switches task events
off through Celery's own ``disable_events`` once the lease has run out, so a worker whose
monitor went away stops paying for events nobody reads. Celery's own commands would switch
them on for good.

The command is replaced in Celery's global registry (``Panel``), as a wrapper: a worker
whose consumer has no :class:`EventsSwitch` (an app not made by ``create_app``) gets
Celery's behaviour unchanged.
"""

from __future__ import annotations

import logging
import time
import types
from collections.abc import Callable
from typing import Any

from celery import bootsteps
from celery.worker import control as celery_control
from celery.worker.consumer.events import Events

from jobs_platform.events.modes import AUTO, FLOWER_INTERVAL_S, OFF

logger = logging.getLogger("jobs_platform.events")

#: Where the consumer keeps its switch, for the control command to find.
ATTR = "jobs_task_events"
#: Celery's own command (the module's function, not the registry entry we replace).
CELERY_ENABLE = celery_control.enable_events


class EventsSwitch:
    """One worker's task events: renewed by ``enable_events``, expired by :meth:`expire`."""

    def __init__(
        self,
        consumer: Any,
        mode: str,
        lease_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.consumer = consumer
        self.mode = mode
        self.lease_s = lease_s
        self.clock = clock
        #: When the last ``enable_events`` arrived; None: no lease running.
        self.renewed_at: float | None = None
        self._refusal_logged = False

    def sending(self) -> bool:
        """Whether task events go out now (Celery's dispatcher: enabled, task group in)."""
        dispatcher = self.consumer.event_dispatcher
        if dispatcher is None or not dispatcher.enabled:
            return False
        return not dispatcher.groups or "task" in dispatcher.groups

    def enable(self, state: Any) -> dict[str, str]:
        """The ``enable_events`` command on this worker."""
        if self.mode == OFF:
            if not self._refusal_logged:  # Flower repeats it every 5 s: say it once
                self._refusal_logged = True
                logger.info(
                    "task events stay off: enable_events refused (JOBS_TASK_EVENTS=off)",
                    extra={"event": "jobs.events.refused"},
                )
            return dict(celery_control.nok("task events are off here (JOBS_TASK_EVENTS=off)"))
        was_sending = self.sending()
        reply: dict[str, str] = CELERY_ENABLE(state)
        if self.mode == AUTO:
            self.renewed_at = self.clock()
            if not was_sending and self.sending():
                logger.info(
                    "task events on: a monitor asked for them (enable_events); off again "
                    "%g s after its last request",
                    self.lease_s,
                    extra={"event": "jobs.events.on"},
                )
        return reply

    def expire(self) -> None:
        """Switch task events off if the lease has run out (the consumer's timer calls it)."""
        if self.renewed_at is None or self.clock() - self.renewed_at < self.lease_s:
            return
        self.renewed_at = None
        if not self.sending():
            return  # switched off by hand (disable_events) meanwhile
        celery_control.disable_events(types.SimpleNamespace(consumer=self.consumer))
        logger.info(
            "task events off: no monitor asked for them (enable_events) for %g s",
            self.lease_s,
            extra={"event": "jobs.events.off"},
        )


def enable_events(state: Any) -> dict[str, str]:
    """Tell worker(s) to send task-related events (jobs-platform: for a lease, see docs)."""
    switch: EventsSwitch | None = getattr(state.consumer, ATTR, None)
    if switch is None:
        result: dict[str, str] = CELERY_ENABLE(state)
        return result
    return switch.enable(state)


def register_commands() -> None:
    """Put :func:`enable_events` in Celery's registry in place of Celery's (idempotent)."""
    celery_control.Panel.register(enable_events, name="enable_events", type="control")


def _send_events_at_all(consumer: Any) -> None:
    """Make the event dispatcher live even on a worker without heartbeats and gossip.

    Celery creates it disabled when it has no event to send at start, and then
    ``enable_events`` changes nothing: a monitor would see no task. Enabled, it sends no
    more than before (task events stay filtered out until a monitor asks).
    """
    step = consumer.blueprint.steps.get(Events.name)
    if isinstance(step, Events):
        step.send_events = step.enabled = True


class TaskEventsLease(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep: the switch, and in ``auto`` mode the timer that ends the lease."""

    label = "jobs-platform task events lease"
    requires = (Events,)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        settings = consumer.app.jobs_settings
        self.switch = EventsSwitch(consumer, settings.task_events, settings.task_events_lease)
        setattr(consumer, ATTR, self.switch)
        self._entry: Any = None
        if self.switch.mode == AUTO:
            # Built after Celery's Events step (required), before any step starts.
            _send_events_at_all(consumer)
            if self.switch.lease_s <= FLOWER_INTERVAL_S:
                logger.warning(
                    "JOBS_TASK_EVENTS_LEASE=%g s is not longer than Flower's %g s between "
                    "enable_events: task events will switch off while Flower runs",
                    self.switch.lease_s,
                    FLOWER_INTERVAL_S,
                    extra={"event": "jobs.events.short_lease"},
                )

    def start(self, consumer: Any) -> None:
        if self.switch.mode != AUTO:
            return
        self.stop(consumer)  # a consumer restart (reconnect) starts the step again
        check_s = min(1.0, self.switch.lease_s / 4)
        self._entry = consumer.timer.call_repeatedly(check_s, self.switch.expire)

    def stop(self, consumer: Any) -> None:
        if self._entry is not None:
            consumer.timer.cancel(self._entry)  # through the timer: eventlet's needs it
            self._entry = None

    def shutdown(self, consumer: Any) -> None:
        self.stop(consumer)
