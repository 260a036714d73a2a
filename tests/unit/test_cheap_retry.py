"""How a published retry ends its attempt (pure: no broker; the worker side is proven in
tests/acceptance/test_retry_end.py)."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from typing import Any

import celery
import pytest
from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from celery.app import trace
from celery.exceptions import Reject, Retry
from kombu.exceptions import EncodeError

from jobs_platform import ReliableTask, TransientError, cheap_retry, create_app
from jobs_platform.spec import RetryIn


def raised(exc: BaseException) -> Any:
    try:
        raise exc
    except BaseException:
        return sys.exc_info()


def test_a_published_retry_gets_exception_info_without_frames() -> None:
    retry = cheap_retry.PublishedRetry(exc=TransientError("partner down"), when=2.0)
    info = cheap_retry.exception_info(raised(retry))
    assert isinstance(info, ExceptionInfo)  # what the worker and Task.apply() expect
    assert info.tb is None
    assert isinstance(info.exception, ExceptionWithTraceback) and info.exception.exc is retry
    assert "Retry in 2.0s: TransientError('partner down')" in info.traceback
    assert "no traceback is recorded" in info.traceback
    # What the pool child sends to the worker's main process: small, and still a Retry.
    data = pickle.dumps(info)
    assert len(data) < 2000
    back = pickle.loads(data)
    assert isinstance(back.exception, Retry) and isinstance(back.exception.exc, TransientError)
    assert back.traceback == info.traceback


@pytest.mark.parametrize(
    "exc", [Retry(exc=TransientError("x"), when=1), TransientError("x"), ValueError("y")]
)
def test_every_other_exception_gets_billiards_exception_info(exc: BaseException) -> None:
    info = cheap_retry.exception_info(raised(exc))
    assert type(info) is ExceptionInfo
    assert info.tb is not None and "Traceback (most recent call last)" in info.traceback


@pytest.fixture()
def tracer_name() -> Iterator[None]:
    saved = trace.ExceptionInfo
    yield
    trace.ExceptionInfo = saved


@pytest.mark.usefixtures("tracer_name")
def test_install_is_idempotent_and_leaves_a_foreign_replacement_alone() -> None:
    trace.ExceptionInfo = ExceptionInfo
    assert cheap_retry.install() and cheap_retry.install()
    assert trace.ExceptionInfo is cheap_retry.exception_info

    def someone_elses(*args: Any, **kwargs: Any) -> Any:
        return ExceptionInfo(*args, **kwargs)

    trace.ExceptionInfo = someone_elses
    assert not cheap_retry.install()
    assert trace.ExceptionInfo is someone_elses


@pytest.fixture()
def app() -> Any:
    return create_app("unit_published", broker_url="memory://", result_backend="cache+memory://")


def test_an_eager_call_retries_in_process(app: Any) -> None:
    attempts: list[int] = []

    @app.task(base=ReliableTask, bind=True, name="u.flaky", queue="fast", max_retries=2)
    def flaky(self: Any) -> str:
        attempts.append(self.request.retries)
        if len(attempts) == 1:
            raise TransientError("once")
        return "ok"

    assert flaky.apply().get() == "ok"
    assert attempts == [0, 1]


@pytest.mark.parametrize(
    ("error", "requeue"),
    [(ConnectionRefusedError(111, "refused"), True), (EncodeError("not JSON"), False)],
)
def test_a_retry_that_cannot_be_published_is_rejected_and_requeued_only_if_the_broker_is_down(
    app: Any, monkeypatch: pytest.MonkeyPatch, error: Exception, requeue: bool
) -> None:
    @app.task(base=ReliableTask, bind=True, name="u.job", queue="fast")
    def job(self: Any) -> None: ...

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise error

    # The retry is published by Celery's Task.apply_async (ReliableTask's checks skipped).
    monkeypatch.setattr(celery.Task, "apply_async", refuse)
    job.push_request(
        id="t-1", retries=0, args=[], kwargs={}, headers={}, delivery_info={"routing_key": "fast"}
    )
    try:
        with pytest.raises(Reject) as rejected:
            job._publish_retry(TransientError("down"), 1, RetryIn(1.0, "transient"))
    finally:
        job.pop_request()
    assert rejected.value.requeue is requeue
    assert rejected.value.reason is error
