"""The releaser bootstep: a pass every interval until stopped; an outage is logged once,
not once per pass; the names install() gives Celery resolve."""

from __future__ import annotations

import logging
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from kombu.utils.imports import symbol_by_name

from jobs_platform.brokers.redis import CONTROL, RELEASER_STEP, TRANSPORT, releaser
from jobs_platform.brokers.redis.delayed import Released
from jobs_platform.brokers.redis.releaser import ReleaserStep, release_interval
from jobs_platform.settings import Settings
from jobs_platform.testing import wait_for


def app(interval: float = 0.01) -> Any:
    return SimpleNamespace(jobs_settings=SimpleNamespace(delayed_release_interval=interval))


def test_the_interval_comes_from_the_settings() -> None:
    assert release_interval(app(0.5)) == 0.5
    assert release_interval(SimpleNamespace(jobs_settings=Settings())) == 0.25


def test_the_step_releases_every_interval_until_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[float] = []
    monkeypatch.setattr(releaser, "release_now", lambda app: passes.append(1) or Released())
    parent = SimpleNamespace(app=app())
    step = ReleaserStep(parent)
    step.start(parent)
    wait_for(lambda: len(passes) >= 3, timeout_s=5, message="three release passes")
    step.stop(parent)
    done = len(passes)
    assert not any(t.name == "jobs-delayed-releaser" for t in threading.enumerate())
    assert len(passes) == done
    step.terminate(parent)  # stopping twice is harmless


def test_an_outage_is_logged_once_and_the_recovery_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def flaky(app: Any) -> Released:
        calls.append(1)
        if len(calls) <= 3:
            raise ConnectionError("redis down")
        return Released()

    monkeypatch.setattr(releaser, "release_now", flaky)
    parent = SimpleNamespace(app=app())
    step = ReleaserStep(parent)
    with caplog.at_level(logging.INFO, logger="jobs_platform.delayed"):
        step.start(parent)
        wait_for(lambda: len(calls) >= 5, timeout_s=5, message="passes after the outage")
        step.stop(parent)
    events = [getattr(r, "event", None) for r in caplog.records]
    assert events.count("jobs.delayed.release_failed") == 1
    assert events.count("jobs.delayed.resumed") == 1


def test_the_names_given_to_celery_resolve() -> None:
    assert symbol_by_name(RELEASER_STEP) is ReleaserStep
    assert symbol_by_name(TRANSPORT).__name__ == "Transport"
    assert symbol_by_name(CONTROL).__name__ == "Control"
