"""Task outcomes counted from Celery's signals (pure: fake tasks, fake Redis)."""

from __future__ import annotations

import types
from typing import Any

from celery import signals

from jobs_platform.metrics import counters, outcomes
from tests.unit.metrics.conftest import FakeClient


def request(queue: str | None = "fast", *, eager: bool = False) -> Any:
    info = {"routing_key": queue} if queue else None
    return types.SimpleNamespace(delivery_info=info, is_eager=eager)


class FakeTask:
    """What the receivers read of a task (hashable, as Celery's signal cache needs)."""

    queue = "fast"  # declared

    def __init__(self, name: str, request: Any) -> None:
        self.name = name
        self.request = request


def task(name: str = "billing.charge", *, queue: str | None = "fast", **kw: Any) -> Any:
    return FakeTask(name, request(queue, **kw))


def totals(client: FakeClient) -> dict[counters.Series, float]:
    counters.flush()
    return client.totals()


def test_an_attempt_that_succeeds_counts_started_succeeded_and_its_runtime(
    recording: FakeClient,
) -> None:
    outcomes.connect()
    t = task()
    signals.task_prerun.send(sender=t, task_id="t1", task=t, args=(), kwargs={})
    signals.task_success.send(sender=t, result=None)
    signals.task_postrun.send(sender=t, task_id="t1", task=t, retval=None, state="SUCCESS")
    got = totals(recording)
    labels = ("billing.charge", "fast")
    assert got[("celery_task_started_total", labels)] == 1
    assert got[("celery_task_succeeded_total", labels)] == 1
    assert got[("celery_task_runtime_count", labels)] == 1
    assert 0 <= got[("celery_task_runtime_sum", labels)] < 1


def test_a_retry_is_counted_with_the_queue_it_came_from(recording: FakeClient) -> None:
    t = task(queue="thirdparty")
    outcomes.on_task_retry(sender=t, request=t.request, reason=None)
    assert totals(recording) == {("celery_task_retried_total", ("billing.charge", "thirdparty")): 1}


def test_a_failure_reported_twice_for_one_task_counts_once(recording: FakeClient) -> None:
    # A hard time limit fires task_failure twice in the worker's main process, where the
    # task's request carries no delivery info: the declared queue labels it.
    t = task(queue=None)
    for _ in range(2):
        outcomes.on_task_failure(sender=t, task_id="t-limit", exception=TimeoutError())
    outcomes.on_task_failure(sender=t, task_id="t-other", exception=ValueError())
    assert totals(recording) == {
        ("celery_task_failed_total", ("billing.charge", "fast", "TimeoutError")): 1,
        ("celery_task_failed_total", ("billing.charge", "fast", "ValueError")): 1,
    }


def test_a_received_message_is_counted_in_the_main_process(recording: FakeClient) -> None:
    received = types.SimpleNamespace(
        task_name="media.render", task=task("media.render"), delivery_info={"routing_key": "heavy"}
    )
    outcomes.on_task_received(sender=None, request=received)
    assert totals(recording) == {("celery_task_received_total", ("media.render", "heavy")): 1}


def test_eager_calls_are_not_jobs_and_are_not_counted(recording: FakeClient) -> None:
    t = task(eager=True)
    outcomes.on_task_prerun(sender=t, task_id="e1", task=t)
    outcomes.on_task_success(sender=t)
    outcomes.on_task_postrun(sender=t, task_id="e1", task=t)
    outcomes.on_task_failure(sender=t, task_id="e1", exception=ValueError())
    assert totals(recording) == {}


def test_nothing_is_counted_while_recording_is_off() -> None:
    t = task()
    outcomes.on_task_prerun(sender=t, task_id="off", task=t)
    outcomes.on_task_postrun(sender=t, task_id="off", task=t)
    assert counters.current() is None
    assert "off" not in outcomes._started


def test_an_exiting_pool_process_flushes_its_counts(recording: FakeClient) -> None:
    outcomes.on_task_success(sender=task())
    assert recording.totals() == {}
    signals.worker_process_shutdown.send(sender=None, pid=1, exitcode=0)
    assert recording.totals() == {("celery_task_succeeded_total", ("billing.charge", "fast")): 1}
