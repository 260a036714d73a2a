"""The overlap marker: "entry E has a run queued or running", for ``overlap="skip"``.

Beat sets ``jobs:beat:running:<entry>`` to the run's task id, atomically, when it sends a
run of an entry that skips overlaps; a slot that finds the marker held is skipped. The
worker clears it (compare-and-delete: only that run can) when the run is over: succeeded or
finally failed (``task_postrun``), failed by a time limit in the main process
(``task_failure``), or revoked. A retry is the same job, so the marker stays, and each
attempt extends it. A worker killed mid-run clears nothing: the marker's TTL (the task's
hard time limit plus the longest queue wait, ``JOBS_BEAT_QUEUE_WAIT``) bounds how long that
can block the entry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis
from celery import signals

from jobs_platform import coordination
from jobs_platform.coordination.lease import Leases
from jobs_platform.process_local import per_process, redis_client
from jobs_platform.schedule.slots import ENTRY_HEADER, KEY_PREFIX

logger = logging.getLogger("jobs_platform.schedule")

RUNNING_PREFIX = KEY_PREFIX + "running:"
RUN_PREFIX = KEY_PREFIX + "run:"
_FINAL_STATES = frozenset({"SUCCESS", "FAILURE"})


def running_key(entry: str) -> str:
    return RUNNING_PREFIX + entry


def run_key(task_id: str) -> str:
    """The run's entry (task id -> entry name), for the receivers that see a task id but
    not the message's headers: the marker's companion key."""
    return RUN_PREFIX + task_id


class RunningMarkers:
    """The overlap markers on one Redis: leases of the run's task id
    (:mod:`jobs_platform.coordination.lease`), each with its run's entry beside it."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._leases = Leases(client)

    def acquire(self, entry: str, task_id: str, ttl_s: float) -> str:
        """Mark ``task_id`` as the entry's run; returns the holder (``task_id`` if it is ours)."""
        holder, _acquired = self._leases.acquire(
            running_key(entry), task_id, ttl_s, companions={run_key(task_id): entry}
        )
        return holder

    def refresh(self, entry: str, task_id: str, ttl_s: float) -> bool:
        """Give ``task_id``'s marker ``ttl_s`` more to live, if it still holds it."""
        return self._leases.extend(
            running_key(entry), task_id, ttl_s, companions=[run_key(task_id)]
        )

    def release(self, entry: str, task_id: str) -> bool:
        return self._leases.release(running_key(entry), task_id, companions=[run_key(task_id)])

    def holder(self, entry: str) -> str | None:
        return self._leases.holder(running_key(entry))

    def entry_of_run(self, task_id: str) -> str | None:
        """The entry whose marker ``task_id`` holds (while it holds it)."""
        return self._leases.holder(run_key(task_id))


def markers_for(url: str) -> RunningMarkers:
    return per_process(("beat-running", url), lambda: RunningMarkers(redis_client(url)))


def queue_wait_s(settings: Any) -> float:
    return float(settings.beat_queue_wait)


def entry_of(request: Any) -> str | None:
    """The beat entry a run belongs to (its header), or None for other jobs."""
    if request is None:
        return None
    headers = getattr(request, "headers", None)
    value = headers.get(ENTRY_HEADER) if isinstance(headers, Mapping) else None
    value = value or getattr(request, ENTRY_HEADER, None)
    return value if isinstance(value, str) and value else None


def _settle(
    task: Any, request: Any, task_id: str | None, *, extend_s: float | None, lookup: bool = False
) -> None:
    """Extend (``extend_s`` seconds) or clear (``None``) the marker of this run's entry.

    ``lookup``: the request may have lost its headers (a time limit or a rejection seen in
    the worker's main process), so find the entry from the task id instead.
    """
    entry = entry_of(request)
    if not task_id or task is None or (entry is None and not lookup):
        return
    try:
        markers = markers_for(coordination.url_of(task.app.jobs_settings))
        entry = entry or markers.entry_of_run(task_id)
        if entry is None:
            return
        if extend_s is None:
            markers.release(entry, task_id)
        else:
            markers.refresh(entry, task_id, extend_s)
    except Exception:
        # A receiver must not raise (Celery only logs it); the marker's TTL still frees it.
        logger.exception(
            "%s[%s]: could not update the overlap marker of beat entry %r",
            getattr(task, "name", "?"),
            task_id,
            entry,
            extra={"event": "jobs.beat.marker_failed"},
        )


def run_budget_s(task: Any) -> float:
    """A run's life: its hard time limit (else the visibility timeout) plus the queue wait."""
    settings = getattr(task.app, "jobs_settings", None)
    limit = getattr(task, "time_limit", None) or task.app.conf.task_time_limit
    if not limit:
        limit = getattr(settings, "visibility_timeout", 3600.0)
    return float(limit) + queue_wait_s(settings)


def _on_prerun(sender: Any = None, task_id: str | None = None, task: Any = None, **_: Any) -> None:
    task = task or sender
    if task is not None:
        _settle(task, task.request, task_id, extend_s=run_budget_s(task))


def _on_retry(sender: Any = None, request: Any = None, **_: Any) -> None:
    if sender is None or request is None:
        return
    spec = getattr(sender, "spec", None)
    wait_s = spec.policy.longest_wait_s if spec is not None else 0.0
    _settle(sender, request, getattr(request, "id", None), extend_s=wait_s + run_budget_s(sender))


def _on_postrun(
    sender: Any = None,
    task_id: str | None = None,
    task: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    task = task or sender
    if state in _FINAL_STATES and task is not None:
        _settle(task, task.request, task_id, extend_s=None)


def _on_failure(
    sender: Any = None, task_id: str | None = None, exception: Any = None, **_: Any
) -> None:
    # A lost worker is retried (task_retry_on_worker_lost): the job is not over.
    if sender is None or type(exception).__name__ == "WorkerLostError":
        return
    _settle(sender, sender.request, task_id, extend_s=None, lookup=True)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        _settle(sender, request, getattr(request, "id", None), extend_s=None, lookup=True)


def connect_receivers() -> None:
    """Extend and clear overlap markers from the worker (idempotent)."""
    signals.task_prerun.connect(_on_prerun, weak=False, dispatch_uid="jobs.beat.prerun")
    signals.task_retry.connect(_on_retry, weak=False, dispatch_uid="jobs.beat.retry")
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="jobs.beat.postrun")
    signals.task_failure.connect(_on_failure, weak=False, dispatch_uid="jobs.beat.failure")
    signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="jobs.beat.revoked")
