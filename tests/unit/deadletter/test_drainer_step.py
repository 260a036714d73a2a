"""The drainer bootstep stops once: one last drain pass on a warm shutdown, none on a cold one;
the consumer and the bootstep create_app names (never imports) resolve in a worker."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from jobs_platform.deadletter import drainer
from jobs_platform.deadletter.drainer import DeadLetterStep, Drained


class FakeDrainer:
    def __init__(self) -> None:
        self.drains = 0

    def drain_quietly(self) -> Drained:
        self.drains += 1
        return Drained()


def running_step(monkeypatch: pytest.MonkeyPatch) -> tuple[DeadLetterStep, FakeDrainer, Any]:
    sink = FakeDrainer()
    monkeypatch.setattr(drainer, "drainer_for", lambda app: sink)
    step = DeadLetterStep(SimpleNamespace())
    step._thread = threading.Thread(target=step._stop.wait, daemon=True)
    step._thread.start()
    return step, sink, SimpleNamespace(app=object())


def test_stop_drains_once_however_often_celery_calls_it(monkeypatch: pytest.MonkeyPatch) -> None:
    step, sink, parent = running_step(monkeypatch)
    thread = step._thread
    step.stop(parent)
    step.stop(parent)
    step.terminate(parent)
    assert sink.drains == 1
    assert thread is not None and not thread.is_alive()


def test_cold_shutdown_stops_the_thread_without_a_last_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step, sink, parent = running_step(monkeypatch)
    thread = step._thread
    step.terminate(parent)
    step.stop(parent)
    assert sink.drains == 0
    assert thread is not None and not thread.is_alive()


def test_create_app_names_the_hooks_and_the_drainer_celery_loads_in_a_worker() -> None:
    # Given by name so that a producer never imports them; the names must resolve.
    from kombu.utils.imports import symbol_by_name

    from jobs_platform import create_app
    from jobs_platform.deadletter import CONSUMER, DRAINER_STEP, hooks

    app = create_app("names", broker_url="memory://")
    assert symbol_by_name(app.conf.worker_consumer) is hooks.DeadLetterConsumer
    assert symbol_by_name(CONSUMER) is hooks.DeadLetterConsumer
    assert DRAINER_STEP in app.steps["worker"]
    assert symbol_by_name(DRAINER_STEP) is DeadLetterStep
