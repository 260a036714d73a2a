"""The private Celery/kombu/billiard/Flower names the platform relies on still have the shape
it expects (jobs_platform/internals.py): an upgrade that moves one fails here, by name."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest
from billiard.einfo import ExceptionInfo
from celery.app import trace
from kombu.transport import redis as kombu_redis

from jobs_platform import cheap_retry, internals


@pytest.mark.parametrize("entry", internals.INTERNALS, ids=lambda e: e.label)
def test_each_private_name_is_there_with_the_expected_shape(entry: internals.Internal) -> None:
    assert internals.problem(entry) is None
    assert entry.why and entry.missing_hook and entry.where


def test_the_tracer_uses_billiards_exception_info_before_the_platform_touches_it() -> None:
    # A fresh interpreter: in this one another test may have installed the cheap retry.
    check = (
        "from celery.app import trace; from billiard.einfo import ExceptionInfo; "
        "assert trace.ExceptionInfo is ExceptionInfo, trace.ExceptionInfo"
    )
    subprocess.run([sys.executable, "-c", check], check=True)


def test_a_removed_name_is_reported_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(kombu_redis.Channel, "_brpop_start")
    assert internals.problems() == [
        "kombu.transport.redis:Channel._brpop_start is gone: type object 'Channel' has no "
        "attribute '_brpop_start'"
    ]


def test_a_changed_signature_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kombu_redis.Channel, "_q_for_pri", lambda self, queue, pri, extra: "")
    (found,) = internals.problems()
    assert "_q_for_pri takes ('self', 'queue', 'pri', 'extra')" in found


def test_a_worker_that_cannot_patch_the_tracer_says_so_once_and_counts_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def someone_elses(*args: object, **kwargs: object) -> ExceptionInfo:
        return ExceptionInfo(*args, **kwargs)

    monkeypatch.setattr(trace, "ExceptionInfo", someone_elses)
    counted = cheap_retry.UNAVAILABLE.labels(cheap_retry.PATCHED)
    before = counted.value()
    step = cheap_retry.CheapRetryStep(SimpleNamespace())
    with caplog.at_level(logging.WARNING, logger="jobs_platform.task"):
        step.start(SimpleNamespace())
    assert not step.installed and trace.ExceptionInfo is someone_elses
    assert [r.event for r in caplog.records] == ["jobs.internals.unavailable"]  # type: ignore[attr-defined]
    assert counted.value() == before + 1


def test_a_worker_that_can_patch_it_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(trace, "ExceptionInfo", ExceptionInfo)
    step = cheap_retry.CheapRetryStep(SimpleNamespace())
    with caplog.at_level(logging.WARNING, logger="jobs_platform.task"):
        step.start(SimpleNamespace())
    assert step.installed and trace.ExceptionInfo is cheap_retry.exception_info
    assert not caplog.records
