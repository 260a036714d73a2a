"""Business keys, stable idempotency keys and unique dispatch (Laravel's ``ShouldBeUnique``).

A task declares its *business key*, the arguments that name the logical job
(``business_key=("invoice_id",)``). From it come:

* ``task.idempotency_key``: ``"billing.charge_invoice:invoice_id=42"``, identical across
  retries, redeliveries and replays (it depends on the arguments, not on the message), to
  pass to downstream APIs as their ``Idempotency-Key``;
* unique dispatch, with ``unique_for=<seconds>``: dispatching the job while one is queued or
  running returns the existing task id instead of enqueuing. The lock is a lease
  (:mod:`jobs_platform.coordination.lease`: one atomic ``SET key task_id NX PX``) on the
  coordination Redis, taken first for :func:`pending_s` only (``JOBS_DISPATCH_TIMEOUT`` +
  2 s, 7 s by default) and given its ``unique_for`` once the job is published: a producer
  killed between the two (a pool child SIGKILLed mid-dispatch) holds it no longer than that,
  instead of blocking every re-dispatch for ``unique_for``. It goes when the job succeeds
  or finally fails (``task_postrun``) or is revoked (``task_revoked``), by
  compare-and-delete so only its own job can remove it. A killed worker runs no receiver:
  ``unique_for`` bounds that.

Unique dispatch is a courtesy to the queue (no pile-up of identical jobs), not a guard:
``send_task`` and replays bypass it. The guards are the status CAS and idempotency keys.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from celery import signals

from jobs_platform import arguments, coordination
from jobs_platform.coordination.lease import Leases, read_acquired
from jobs_platform.errors import DispatchError
from jobs_platform.idempotency import events
from jobs_platform.process_local import per_process, redis_client

logger = logging.getLogger("jobs_platform.idempotency")

LOCK_PREFIX = "jobs:unique:"
#: Longer identities are hashed so they fit an ``Idempotency-Key`` header (255 at most).
MAX_IDENTITY_LENGTH = 200
#: A lock is first taken for the publish's own bound (JOBS_DISPATCH_TIMEOUT) plus this.
PENDING_SLACK_S = 2.0

#: Celery states after which the job is over (a RETRY is still the same job).
_FINAL_STATES = frozenset({"SUCCESS", "FAILURE"})


def business_identity(task_name: str, values: Mapping[str, Any]) -> str:
    """``"<task>:<name>=<json>,..."``: the stable identity of one logical job."""
    parts = ",".join(
        f"{name}={arguments.dumps(value, sort_keys=True, separators=(',', ':'))}"
        for name, value in values.items()
    )
    identity = f"{task_name}:{parts}"
    if len(identity) > MAX_IDENTITY_LENGTH:
        digest = hashlib.sha256(identity.encode()).hexdigest()
        identity = f"{task_name[:100]}:sha256={digest}"
    return identity


def identity_of(task: Any, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None) -> str:
    """The identity of ``task`` called with ``args``/``kwargs`` (its business key values)."""
    names: tuple[str, ...] = task.spec.business_key
    try:
        bound = inspect.signature(task.run).bind(*(args or ()), **(kwargs or {}))
    except TypeError as exc:
        raise DispatchError(f"{task.name}: {exc}") from None
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    extra = arguments.pop(
        next((n for n, p in bound.signature.parameters.items() if p.kind is p.VAR_KEYWORD), ""), {}
    )
    arguments.update(extra)
    missing = [n for n in names if n not in arguments]
    if missing:
        raise DispatchError(f"{task.name}: business key argument(s) {missing} not given")
    return business_identity(task.name, {n: arguments[n] for n in names})


class UniqueLocks:
    """The dispatch locks, leases on one Redis (the coordination Redis)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.leases = Leases(client)

    def acquire(self, identity: str, task_id: str, ttl_s: float) -> tuple[str, bool]:
        """``(holder, acquired_now)``: the id of the job holding the lock after this call."""
        return self.leases.acquire(LOCK_PREFIX + identity, task_id, ttl_s)

    def release(self, identity: str, task_id: str) -> bool:
        return self.leases.release(LOCK_PREFIX + identity, task_id)

    def confirm(self, identity: str, task_id: str, ttl_s: float) -> bool:
        """The job is published: its lock lives ``ttl_s`` (``unique_for``) from now, if it
        still holds it. A lock that is gone is not taken again: the job may already have
        run and released it (a fast worker beats the producer's confirm), and a lock
        brought back then would turn every re-dispatch away for ``unique_for``."""
        return bool(self.leases.extend(LOCK_PREFIX + identity, task_id, ttl_s))

    def confirm_many(self, claims: Sequence[tuple[str, str]], ttl_s: float) -> None:
        """:meth:`confirm` for each ``(identity, task_id)``, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for identity, task_id in claims:
            self.leases.extend_on(pipe, LOCK_PREFIX + identity, task_id, ttl_s)
        pipe.execute()

    def acquire_many(self, claims: Sequence[tuple[str, str]], ttl_s: float) -> list[str]:
        """:meth:`acquire` for each ``(identity, task_id)``, in order, in one round trip;
        the holder after each (Redis runs the scripts in order: a repeated identity gets
        the first claimant's id)."""
        pipe = self.client.pipeline(transaction=False)
        for identity, task_id in claims:
            self.leases.acquire_on(pipe, LOCK_PREFIX + identity, task_id, ttl_s)
        return [read_acquired(reply)[0] for reply in pipe.execute()]

    def release_many(self, claims: Sequence[tuple[str, str]]) -> None:
        """:meth:`release` for each ``(identity, task_id)`` in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        for identity, task_id in claims:
            self.leases.release_on(pipe, LOCK_PREFIX + identity, task_id)
        pipe.execute()

    def holder(self, identity: str) -> str | None:
        return self.leases.holder(LOCK_PREFIX + identity)


def locks_for(url: str) -> UniqueLocks:
    """The locks on the Redis at ``url``, one per process."""
    return per_process(("unique-locks", url), lambda: UniqueLocks(redis_client(url)))


def dispatch_once(
    task: Any, args: Any, kwargs: Any, options: dict[str, Any], publish: Callable[..., Any]
) -> Any:
    """Publish unless the same logical job is queued or running; return its AsyncResult.

    A call with an explicit ``task_id`` re-publishes a known job (a retry keeps its id, as
    does a replay of the same message): it is always published, since dropping it could
    lose the job, and it neither takes nor checks the lock (no Redis round trip).
    """
    identity = identity_of(task, args, kwargs)  # also validates the business key arguments
    if options.get("task_id"):
        return publish(args, kwargs, **options)
    task_id = _new_id()
    locks = locks_for(coordination.url_of(task.app.jobs_settings))
    unique_for = task.spec.unique_for_s
    holder, acquired = locks.acquire(
        identity, task_id, pending_s(task.app.jobs_settings, unique_for)
    )
    if holder != task_id:
        events.skipped(
            task.name,
            "unique",
            "%s: %s is already queued or running as %s",
            task.name,
            identity,
            holder,
        )
        return task.AsyncResult(holder)
    try:
        result = publish(args, kwargs, **{**options, "task_id": task_id})
    except BaseException:
        if acquired:
            locks.release(identity, task_id)
        raise
    locks.confirm(identity, task_id, unique_for)
    return result


def pending_s(settings: Any, unique_for_s: float) -> float:
    """How long a lock lives before its job is published: the publish's own bound (a
    producer killed meanwhile blocks re-dispatches no longer), at most ``unique_for``."""
    return min(unique_for_s, float(settings.dispatch_timeout) + PENDING_SLACK_S)


def _new_id() -> str:
    from celery.utils import uuid

    return str(uuid())


def release_for(task: Any, task_id: str | None, args: Any, kwargs: Any) -> None:
    spec = getattr(task, "spec", None)
    if not task_id or spec is None or spec.unique_for_s is None:
        return
    try:
        identity = identity_of(task, args, kwargs)
        locks_for(coordination.url_of(task.app.jobs_settings)).release(identity, task_id)
    except Exception:
        # Receivers must not raise (Celery only logs it); the lock's TTL still frees it.
        logger.exception(
            "%s[%s]: could not release its unique-dispatch lock",
            task.name,
            task_id,
            extra={"event": "jobs.unique.release_failed", "task_name": task.name},
        )


def _on_postrun(
    sender: Any = None,
    task_id: str | None = None,
    args: Any = None,
    kwargs: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    if state in _FINAL_STATES:
        release_for(sender, task_id, args, kwargs)


def _on_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    if request is not None:
        release_for(
            sender,
            getattr(request, "id", None),
            getattr(request, "args", None),
            getattr(request, "kwargs", None),
        )


def connect_receivers() -> None:
    """Release unique-dispatch locks when jobs end (idempotent: one connection per process)."""
    signals.task_postrun.connect(_on_postrun, weak=False, dispatch_uid="jobs.unique.postrun")
    signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="jobs.unique.revoked")
