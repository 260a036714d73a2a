"""What ReliableTask does for the flow options, at dispatch and around a run.

- :func:`take_slot` / :func:`release_slot`: a run of a ``concurrency_key`` task holds one
  of its key's slots (:mod:`.concurrency`); a job over the limit is re-published to wait
  (same id, same attempt count: no attempt is burned, the pool slot is free at once) and
  the job that frees a slot re-publishes the oldest waiter.
- :func:`dispatch_debounced` / :func:`end_debounce_trigger`: a dispatch of a ``debounce``
  task joins its key's window (:mod:`.debounce`) and returns the run's id; the window's
  trigger publishes the one run.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from celery.exceptions import Ignore
from kombu.utils.json import dumps, loads

from jobs_platform import coordination, dispatch
from jobs_platform.brokers.interface import FAIRNESS_HEADER
from jobs_platform.errors import DispatchError
from jobs_platform.flow import breaker, concurrency, debounce
from jobs_platform.flow.options import key_of
from jobs_platform.metrics import names
from jobs_platform.metrics.counters import RecordedCounter

logger = logging.getLogger("jobs_platform.flow")

WAITED = RecordedCounter(names.CONCURRENCY_WAITED)
COLLAPSED = RecordedCounter(names.DEBOUNCE_COLLAPSED)
BREAKER_DEFERRED = RecordedCounter(names.BREAKER_DEFERRED)
BREAKER_OPENED = RecordedCounter(names.BREAKER_OPENED)

Slot = tuple[str, str]


def _url(task: Any) -> str:
    return coordination.url_of(task.app.jobs_settings)


# -- per-key concurrency -----------------------------------------------------------------------


def check_concurrency_key(task: Any, args: Any, kwargs: Any) -> None:
    """At dispatch: the key function accepts these arguments and gives a string."""
    key_of(
        task.spec.concurrency.key,
        args,
        kwargs,
        task=task.name,
        option="concurrency_key",
        error=DispatchError,
    )


def take_slot(task: Any, args: Any, kwargs: Any) -> Slot:
    """A slot of this job's key, held (and extended) until :func:`release_slot`; else the
    job is re-published to wait and Ignore ends this delivery."""
    spec = task.spec.concurrency
    request = task.request
    key = key_of(spec.key, args, kwargs, task=task.name, option="concurrency_key")
    headers = dict(request.headers or {})
    carried = headers.get(concurrency.GEN_HEADER)
    generation = carried if isinstance(carried, str) else None
    headers[concurrency.GEN_HEADER] = new_generation = concurrency.new_generation()
    signature = task.signature_from_request(request, queue=task._queue_of(request), headers=headers)
    lease_s = float(task.app.jobs_settings.worker_lease)
    url = _url(task)
    taken = concurrency.slots_for(url).take(
        key,
        spec.limit,
        owner=request.id,
        generation=generation,
        new_generation=new_generation,
        record=dumps({"task": task.name, "signature": dict(signature)}),
        ttl_s=lease_s,
        fallback_max_s=lease_s,
    )
    if taken.slot is not None:
        concurrency.keeper_for(url, lease_s).hold(taken.slot, request.id)
        return key, taken.slot
    if taken.stale:
        logger.debug("%s[%s]: a copy of a wait already taken up, dropped", task.name, request.id)
        raise Ignore()
    task._republish(signature.set(countdown=taken.wait_s))
    WAITED.labels(task.name).inc()
    logger.info(
        "%s[%s] waits for a slot of %r (limit %d); asks again in %.1f s at the latest",
        task.name,
        request.id,
        key,
        spec.limit,
        taken.wait_s,
        extra={"event": "jobs.flow.waiting", "task_name": task.name},
    )
    raise Ignore()


def release_slot(task: Any, slot: Slot) -> None:
    """Drop this job's slot and re-publish the oldest job waiting for its key."""
    key, slot_key = slot
    owner = task.request.id
    url = _url(task)
    concurrency.keeper_for(url, float(task.app.jobs_settings.worker_lease)).drop(slot_key)
    try:
        record = concurrency.slots_for(url).release(key, slot_key, owner)
        if record is not None:
            _wake(task.app, record)
    except Exception:
        # The slot runs out within the lease and the waiter's own deferral comes back.
        logger.exception(
            "jobs.flow.release_failed: the slot of %r or its next waiter was not handed on",
            key,
            extra={"event": "jobs.flow.release_failed"},
        )


def _wake(app: Any, record: str) -> None:
    data = loads(record)
    waiter = app.tasks.get(data.get("task"))
    republish = getattr(waiter, "_republish", None)
    if republish is None:
        return  # not a task this worker knows: its own deferral brings it back
    republish(app.signature(data["signature"]))


# -- fairness ---------------------------------------------------------------------------------


def with_fairness_key(task: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with this dispatch's fairness key in its headers: the broker queues the
    job under the key (its retries and deferrals keep the header, so the key)."""
    key = key_of(
        task.spec.fairness_key,
        args,
        kwargs,
        task=task.name,
        option="fairness_key",
        error=DispatchError,
    )
    return {**options, "headers": {**(options.get("headers") or {}), FAIRNESS_HEADER: key}}


# -- debounce ----------------------------------------------------------------------------------


def _debounce_key(task: Any, args: Any, kwargs: Any) -> str:
    function = task.spec.debounce.key
    if function is None:
        return str(task.name)
    return key_of(
        function, args, kwargs, task=task.name, option="debounce_key", error=DispatchError
    )


def dispatch_debounced(task: Any, args: Any, kwargs: Any, options: dict[str, Any]) -> Any:
    """Join the window of this dispatch's key: the AsyncResult of the run that will happen."""
    spec = task.spec.debounce
    key = _debounce_key(task, args, kwargs)
    windows = debounce.windows_for(_url(task))
    placed = windows.dispatch(
        task.name,
        key,
        new_id=str(options.get("task_id") or uuid.uuid4()),
        arguments=dispatch.encode_arguments(task, args, kwargs),
        window_s=spec.window_s,
        max_s=spec.max_s,
    )
    if not placed.opened:
        COLLAPSED.labels(task.name).inc()
        return task.AsyncResult(placed.id)
    headers = {**(options.get("headers") or {}), debounce.TRIGGER_HEADER: key}
    trigger = {**options, "task_id": placed.id, "countdown": placed.due_in_s, "headers": headers}
    trigger.pop("eta", None)
    try:
        return task._republish(task.signature(args, kwargs, trigger))
    except Exception:
        windows.abandon(task.name, key, placed.id)  # nothing would ever publish its run
        raise


def end_debounce_trigger(task: Any) -> None:
    """If this delivery is a window's trigger: publish the run when the key is quiet, or
    come back when it may be; Ignore ends the trigger either way. A run returns at once."""
    request = task.request
    headers = dict(request.headers or {})
    key = headers.pop(debounce.TRIGGER_HEADER, None)
    if not isinstance(key, str):
        return
    windows = debounce.windows_for(_url(task))
    claim = windows.claim(task.name, key, request.id)
    queue = task._queue_of(request)
    if claim.arguments is not None:
        args, kwargs = loads(claim.arguments)
        run = task.signature_from_request(
            request, args=args, kwargs=kwargs, queue=queue, headers=headers
        )
        task._republish(run)
        windows.published(request.id)
        logger.info(
            "%s[%s]: %r quiet, the run published with the last dispatch's arguments",
            task.name,
            request.id,
            key,
            extra={"event": "jobs.flow.debounced", "task_name": task.name},
        )
    elif not claim.done:
        task._republish(
            task.signature_from_request(
                request,
                queue=queue,
                countdown=claim.wait_s,
                headers={**headers, debounce.TRIGGER_HEADER: key},
            )
        )
    raise Ignore()


# -- circuit breaker ---------------------------------------------------------------------------


def pass_breaker(task: Any) -> bool:
    """Whether this job may call its downstream now (True: as the half-open breaker's
    probe). Else it is deferred (same id, same attempt: ReliableTask._defer, as a rate limit
    defers) until the breaker may let it through, and Ignore ends this delivery."""
    spec = task.spec
    request = task.request
    admitted = breaker.breakers_for(_url(task)).admit(
        spec.breaker, request.id, probe_ttl_s=spec.time_limit_s + breaker.PROBE_SLACK_S
    )
    if admitted.run:
        if admitted.probe:
            logger.info(
                "%s[%s] probes %r (the breaker is half-open)",
                task.name,
                request.id,
                spec.breaker.key,
                extra={"event": "jobs.breaker.probe", "task_name": task.name},
            )
        return admitted.probe
    task._defer(admitted.wait_s)
    BREAKER_DEFERRED.labels(spec.breaker.key).inc()
    logger.info(
        "%s[%s] deferred %.1f s: the breaker of %r is %s",
        task.name,
        request.id,
        admitted.wait_s,
        spec.breaker.key,
        admitted.state.replace("_", "-"),
        extra={"event": "jobs.breaker.deferred", "task_name": task.name},
    )
    raise Ignore()


def breaker_failed(task: Any, step: Any, *, probe: bool) -> None:
    """Count this attempt's failure against the downstream when it is the downstream's
    (``TaskSpec.counts_against_downstream``); a probe failing otherwise gives its claim up."""
    spec = task.spec
    request = task.request
    breakers = breaker.breakers_for(_url(task))
    try:
        if not spec.counts_against_downstream(step):
            if probe:
                breakers.release_probe(spec.breaker, request.id)
            return
        failure = breakers.failed(
            spec.breaker, request.id, f"{request.id}:{request.retries}:{uuid.uuid4().hex[:8]}"
        )
    except Exception:
        # The job's own retry goes on; the breaker only misses one failure.
        logger.exception(
            "jobs.breaker.record_failed: a failure of %r was not counted",
            spec.breaker.key,
            extra={"event": "jobs.breaker.record_failed"},
        )
        return
    if failure.opened:
        BREAKER_OPENED.labels(spec.breaker.key).inc()
        logger.warning(
            "jobs.breaker.opened: the breaker of %r opened (%s of %s[%s]); jobs of the key "
            "wait %.0f s, then one probes",
            spec.breaker.key,
            "the probe's failure" if probe else f"{spec.breaker.threshold} failures in a row",
            task.name,
            request.id,
            spec.breaker.cooldown_s,
            extra={"event": "jobs.breaker.opened", "task_name": task.name},
        )


def breaker_succeeded(task: Any) -> None:
    """A success of the downstream: ends a run of failures; the probe's closes the breaker."""
    spec = task.spec
    try:
        closed = breaker.breakers_for(_url(task)).succeeded(spec.breaker, task.request.id)
    except Exception:
        logger.exception(
            "jobs.breaker.record_failed: a success of %r was not recorded",
            spec.breaker.key,
            extra={"event": "jobs.breaker.record_failed"},
        )
        return
    if closed:
        logger.warning(
            "jobs.breaker.closed: the probe %s[%s] succeeded; the breaker of %r is closed",
            task.name,
            task.request.id,
            spec.breaker.key,
            extra={"event": "jobs.breaker.closed", "task_name": task.name},
        )


def end_probe(task: Any) -> None:
    """A probe that ended without an outcome (Ignore, Retry, Reject) gives its claim up."""
    try:
        breaker.breakers_for(_url(task)).release_probe(task.spec.breaker, task.request.id)
    except Exception:
        logger.exception(
            "jobs.breaker.release_failed: the probe's claim runs out instead",
            extra={"event": "jobs.breaker.release_failed"},
        )
