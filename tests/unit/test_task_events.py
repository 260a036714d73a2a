"""JOBS_TASK_EVENTS in a worker, without a broker: the lease, the commands, Flower's option.

The real thing (worker processes, Redis, an event receiver) is
tests/acceptance/test_task_events.py; this pins the logic it relies on.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest
from celery.worker import control as celery_control

from jobs_platform import create_app
from jobs_platform.events import celery_config, flower_enables_events, lease
from jobs_platform.flower import check_options, flower_options
from jobs_platform.settings import Settings
from jobs_platform.testing import FakeClock


def consumer(groups: set[str] | None = None, enabled: bool = True) -> Any:
    """A consumer as Celery's commands see it: an event dispatcher with groups."""
    dispatcher = types.SimpleNamespace(enabled=enabled, groups=set(groups or ()))
    return types.SimpleNamespace(event_dispatcher=dispatcher)


def switch(mode: str, clock: FakeClock, groups: set[str] | None = None) -> lease.EventsSwitch:
    c = consumer({"worker"} if groups is None else groups)
    return lease.EventsSwitch(c, mode, 15.0, clock=clock.monotonic)


def state(s: lease.EventsSwitch) -> Any:
    return types.SimpleNamespace(consumer=s.consumer)


def test_modes_start_workers_and_producers_as_told() -> None:
    assert celery_config("auto") == {
        "worker_send_task_events": False,
        "task_send_sent_event": False,
    }
    assert celery_config("off") == {"worker_send_task_events": False, "task_send_sent_event": False}
    assert celery_config("on") == {"worker_send_task_events": True, "task_send_sent_event": True}
    app = create_app("ev", broker_url="memory://", task_events="on")
    assert app.conf.worker_send_task_events and app.conf.task_send_sent_event
    app = create_app("ev", broker_url="memory://")
    assert app.conf.worker_send_task_events is False


def test_auto_switches_on_at_enable_events_and_off_after_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    s = switch("auto", clock)
    assert not s.sending()
    caplog.set_level(logging.INFO, logger="jobs_platform.events")
    assert s.enable(state(s)) == {"ok": "task events enabled"}
    assert s.sending()
    assert "task events on" in caplog.text
    clock.advance(10)
    s.expire()
    assert s.sending()  # within the lease
    assert s.enable(state(s)) == {"ok": "task events already enabled"}  # renewed
    clock.advance(14)
    s.expire()
    assert s.sending()  # 24 s after the first, 14 s after the renewal
    clock.advance(1)
    s.expire()
    assert not s.sending()
    assert "task events off" in caplog.text
    # Off through Celery's own path: the worker group stays, task left it.
    assert s.consumer.event_dispatcher.groups == {"worker"}
    s.enable(state(s))
    assert s.sending()


def test_auto_without_a_request_never_switches_anything() -> None:
    clock = FakeClock()
    s = switch("auto", clock)
    clock.advance(1000)
    s.expire()
    assert not s.sending() and s.renewed_at is None


def test_off_refuses_enable_events_and_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    s = switch("off", FakeClock())
    caplog.set_level(logging.INFO, logger="jobs_platform.events")
    for _ in range(3):
        assert "error" in s.enable(state(s))
    assert not s.sending()
    assert caplog.text.count("enable_events refused") == 1


def test_on_stays_on_and_has_no_lease() -> None:
    clock = FakeClock()
    s = switch("on", clock, groups=set())  # Celery's groups with task events on: all
    assert s.sending()
    s.enable(state(s))
    clock.advance(1000)
    s.expire()
    assert s.sending()


def test_a_switch_on_a_disabled_dispatcher_reports_nothing_sent() -> None:
    s = lease.EventsSwitch(consumer({"worker", "task"}, enabled=False), "auto", 15.0)
    assert not s.sending()
    s.consumer.event_dispatcher = None
    assert not s.sending()


def test_the_command_is_ours_and_passes_through_for_other_workers() -> None:
    create_app("ev", broker_url="memory://")
    assert celery_control.Panel.data["enable_events"] is lease.enable_events
    plain = consumer({"worker"})  # a worker of an app not made by create_app
    reply = lease.enable_events(types.SimpleNamespace(consumer=plain))
    assert reply == {"ok": "task events enabled"}
    assert plain.event_dispatcher.groups == {"worker", "task"}


@pytest.mark.parametrize(("mode", "asks"), [("auto", True), ("on", True), ("off", False)])
def test_flower_asks_for_events_unless_the_workers_refuse_them(mode: str, asks: bool) -> None:
    assert flower_enables_events(mode) is asks
    options = flower_options(Settings.load(environ={}, task_events=mode, flower_db=""))
    assert options["enable_events"] is asks
    summary = check_options(options, unsafe_no_auth=True)
    assert ("asks the workers for task events" in summary) is asks
