"""The drainer bootstep stops once: one last drain pass on a warm shutdown, none on a cold one."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from jobs_platform.deadletter import worker
from jobs_platform.deadletter.worker import DeadLetterStep


class FakeSink:
    def __init__(self) -> None:
        self.drains = 0

    def drain_quietly(self) -> int:
        self.drains += 1
        return 0


def running_step(monkeypatch: pytest.MonkeyPatch) -> tuple[DeadLetterStep, FakeSink, Any]:
    sink = FakeSink()
    monkeypatch.setattr(worker, "_sink", lambda app: sink)
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
