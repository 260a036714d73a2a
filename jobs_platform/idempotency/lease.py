"""Claim owners and leases, shared by the status CAS and the idempotency-key table.

A claim names its owner (unique per attempt, so two deliveries of one message are told
apart) and carries a lease. The default lease is the task's hard time limit: past it the
worker has killed the attempt, so the claimant is certainly gone and the claim may be
taken over; and since every hard limit sits below the visibility timeout minus its margin
(an invariant checked at declaration), a message redelivered after a crash always finds
the crashed attempt's lease expired. Leases are compared with the workers' clocks (UTC),
so those clocks must agree to well within a lease (NTP).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any, TypeAlias

from jobs_platform.errors import ConfigError

Clock: TypeAlias = Callable[[], dt.datetime]


def current_task() -> Any:
    """The Celery task running in this thread, or ``None`` outside a worker."""
    from celery import current_task as proxy

    task = proxy._get_current_object()
    if task is None or getattr(task.request, "called_directly", True):
        return None
    return task


def job_of(task: Any) -> str | None:
    """The running job's task id (kept across retries and redeliveries), if any."""
    return getattr(getattr(task, "request", None), "id", None) or None


def new_owner(task: Any = None) -> str:
    """A claim owner, unique per attempt: ``<task id>/<host>:<pid>/<nonce>``.

    The task id comes first so that a later attempt of the *same job* can recognise the
    claim as its own dead predecessor's (see :func:`same_job_prefix`).
    """
    return f"{job_of(task) or '-'}/{socket.gethostname()}:{os.getpid()}/{uuid.uuid4().hex[:12]}"


def same_job_prefix(task: Any) -> str | None:
    """Owner prefix of claims made by earlier attempts of the running job.

    Celery runs a job again (a retry, a lost-worker retry, a redelivery) only once the
    previous attempt has ended, so such a claim may be taken over at once, without waiting
    for its lease: otherwise a child killed mid-side-effect and retried at once would find
    its own claim "live" and skip, leaving the row in progress with no message left.
    """
    job = job_of(task)
    return None if job is None else f"{job}/"


def lease_for(task: Any, lease_s: float | None) -> float:
    """``lease_s`` if given, else the running task's hard time limit."""
    if lease_s is None:
        lease_s = getattr(task, "time_limit", None) if task is not None else None
    if lease_s is None:
        raise ConfigError(
            "no lease: pass lease_s=... (outside a task there is no hard time limit to default to)"
        )
    if isinstance(lease_s, bool) or float(lease_s) <= 0:
        raise ConfigError(f"lease_s must be a number of seconds > 0, got {lease_s!r}")
    return float(lease_s)
