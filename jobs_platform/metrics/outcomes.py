"""Task outcomes counted from Celery's signals, so metrics never need task events.

Where each receiver runs (prefork):

==================  ==========================  =======================================
signal              process                     counts
==================  ==========================  =======================================
task_received       worker main (consumer)      ``celery_task_received_total``
task_prerun         pool child                  ``celery_task_started_total``
task_success        pool child                  ``celery_task_succeeded_total``
task_retry          pool child (ReliableTask    ``celery_task_retried_total``
                    raises Celery's Retry);
                    main on a lost worker
task_failure        pool child; main on a hard  ``celery_task_failed_total``
                    time limit, lost worker,
                    ``Reject``
task_postrun        pool child                  ``celery_task_runtime`` (prerun->postrun)
==================  ==========================  =======================================

A hard time limit fires ``task_failure`` twice in the main process (Celery 5.7): a task
id that failed moments ago in this process is not counted again. An attempt killed by
its time limit has no runtime observation (its child died before ``task_postrun``).
Eager calls (``task.apply()``) are not jobs and are not counted.
"""

from __future__ import annotations

import time
from typing import Any

from celery import signals

from jobs_platform.metrics import counters, names

#: task id -> perf_counter() at task_prerun, in this pool process.
_started: dict[str, float] = {}
#: task id -> monotonic time of its task_failure in this process (see the docstring).
_failed: dict[str, float] = {}
FAILURE_DEDUPE_S = 30.0
_FAILED_PRUNE_AT = 1024


def _queue(task: Any, request: Any) -> str:
    """The queue a delivery came from; the task's declared queue when Celery gives no
    delivery info (failures reported by the main process)."""
    info = getattr(request, "delivery_info", None) or {}
    routing_key = info.get("routing_key") if isinstance(info, dict) else None
    if routing_key:
        return str(routing_key)
    declared = getattr(task, "queue", None)
    if isinstance(declared, str) and declared:
        return declared
    router = getattr(getattr(task, "app", None), "jobs_router", None)
    routed = router.queue_for(getattr(task, "name", "")) if router is not None else None
    return routed or ""


def _eager(request: Any) -> bool:
    return bool(getattr(request, "is_eager", False))


def on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is None or not counters.active():
        return
    counters.record(
        (names.TASK_RECEIVED.name, (str(request.task_name), _queue(request.task, request)))
    )


def on_task_prerun(
    sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any
) -> None:
    if task is None or task_id is None or not counters.active() or _eager(task.request):
        return
    counters.record((names.TASK_STARTED.name, (task.name, _queue(task, task.request))))
    _started[task_id] = time.perf_counter()


def on_task_postrun(
    sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any
) -> None:
    began = _started.pop(task_id, None) if task_id is not None else None
    if began is None or task is None:
        return
    seconds = time.perf_counter() - began
    counters.observe(names.TASK_RUNTIME, (task.name, _queue(task, task.request)), seconds)


def on_task_success(sender: Any = None, **_: Any) -> None:
    if sender is None or not counters.active() or _eager(sender.request):
        return
    counters.record((names.TASK_SUCCEEDED.name, (sender.name, _queue(sender, sender.request))))


def on_task_retry(sender: Any = None, request: Any = None, **_: Any) -> None:
    if sender is None or not counters.active() or _eager(request):
        return
    counters.record((names.TASK_RETRIED.name, (sender.name, _queue(sender, request))))


def on_task_failure(
    sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
) -> None:
    if sender is None or not counters.active() or _eager(sender.request):
        return
    if task_id is not None and not _first_failure(task_id):
        return
    exception_name = type(exception).__name__ if exception is not None else ""
    counters.record(
        (names.TASK_FAILED.name, (sender.name, _queue(sender, sender.request), exception_name))
    )


def _first_failure(task_id: str, clock: Any = time.monotonic) -> bool:
    now = clock()
    if len(_failed) >= _FAILED_PRUNE_AT:
        for old in [tid for tid, at in _failed.items() if now - at > FAILURE_DEDUPE_S]:
            del _failed[old]
    seen = _failed.get(task_id)
    _failed[task_id] = now
    return seen is None or now - seen > FAILURE_DEDUPE_S


def on_worker_process_shutdown(**_: Any) -> None:
    """A pool child is leaving (recycled, or the worker stops): flush its counts now; it
    exits with ``os._exit``, so neither its thread nor ``atexit`` would."""
    counters.flush()


def connect() -> None:
    """Connect the receivers once per process (they serve every jobs-platform app)."""
    for signal, receiver in (
        (signals.task_received, on_task_received),
        (signals.task_prerun, on_task_prerun),
        (signals.task_postrun, on_task_postrun),
        (signals.task_success, on_task_success),
        (signals.task_retry, on_task_retry),
        (signals.task_failure, on_task_failure),
        (signals.worker_process_shutdown, on_worker_process_shutdown),
    ):
        signal.connect(receiver, weak=False, dispatch_uid=f"jobs.metrics.{receiver.__name__}")
