"""What a dispatch checks before anything is sent: one copy for ``.delay()`` and bulk.

``ReliableTask.apply_async`` and :mod:`jobs_platform.bulk` both call these, so a call is
refused for the same reasons, with the same words, whichever way it is sent:

- :func:`check_options`: an explicit queue is a declared one; a countdown or ETA is
  within ``JOBS_MAX_DELAY``;
- :func:`check_size` / :func:`encode_arguments`: the arguments are kombu's JSON, so each
  value arrives as the type it was sent (:mod:`jobs_platform.arguments`: a set is refused,
  naming where it is; a datetime or a Decimal round-trips), and within
  ``JOBS_MAX_PAYLOAD_BYTES`` (:mod:`jobs_platform.payload` measures them);
- :func:`broker_unreachable`: the error a caller gets when the broker did not answer.

Every dispatch carries the task's payload version (:func:`versioned`). A retry or a deferral
ReliableTask publishes itself was checked when it was first dispatched: it skips all of this
(``ReliableTask._republish``), Celery's argument check included
(:func:`jobs_platform.signature_check.unchecked`): a job
of an older payload version, re-published by newer code, binds only once upcast.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from kombu.exceptions import OperationalError

from jobs_platform import arguments, brokers, history, rules
from jobs_platform.brokers.interface import Broker
from jobs_platform.clock import as_utc, utc_iso, utcnow
from jobs_platform.errors import DispatchError
from jobs_platform.payload import arguments_json, size_of
from jobs_platform.urls import masked


def delay_seconds(countdown: Any, eta: Any) -> float | None:
    """How far in the future a dispatch asks to run, from ``countdown`` or ``eta``."""
    if countdown is not None:
        return float(countdown)
    if eta is None:
        return None
    when: dt.datetime = dt.datetime.fromisoformat(eta) if isinstance(eta, str) else eta
    return max(0.0, (as_utc(when) - utcnow()).total_seconds())


def check_options(task: Any, options: Mapping[str, Any]) -> None:
    """An explicit queue must be declared; a countdown or ETA within ``JOBS_MAX_DELAY``."""
    if options.get("queue") is not None:
        rules.check_dispatch_queue(options["queue"], task=task.name)
    delay_s = delay_seconds(options.get("countdown"), options.get("eta"))
    if delay_s is not None:
        rules.check_dispatch_delay(task.name, delay_s, max_delay_s=task.app.jobs_settings.max_delay)


def not_json(task: Any, exc: BaseException, args: Any, kwargs: Any) -> DispatchError:
    """The refusal of arguments kombu's JSON cannot carry, naming the argument."""
    return DispatchError(arguments.refusal(task.name, args, kwargs, exc))


def encode_arguments(task: Any, args: Any, kwargs: Any) -> str:
    """The JSON of ``[args, kwargs]`` as kombu sends it, within ``JOBS_MAX_PAYLOAD_BYTES``;
    DispatchError when a value cannot be sent (naming it) or the whole is too large."""
    try:
        payload = arguments_json(args, kwargs, dumps=arguments.dumps)
    except (TypeError, ValueError) as exc:
        raise not_json(task, exc, args, kwargs) from exc
    _check_bytes(task, size_of(payload))
    return payload


def check_size(task: Any, args: Any, kwargs: Any) -> None:
    """Refuse, before anything is sent, arguments kombu's JSON cannot carry or that are over
    ``JOBS_MAX_PAYLOAD_BYTES``."""
    encode_arguments(task, args, kwargs)


def _check_bytes(task: Any, size: int) -> None:
    rules.check_dispatch_payload(
        task.name, size, max_bytes=task.app.jobs_settings.max_payload_bytes
    )


def stamped(options: dict[str, Any], stamp: str | None = None) -> dict[str, Any]:
    """``options`` whose headers carry the enqueue stamp (kept if the caller set one)."""
    headers = options.get("headers") or {}
    if history.ENQUEUED_HEADER in headers:
        return options
    return {**options, "headers": {**headers, history.ENQUEUED_HEADER: stamp or utc_iso()}}


def versioned(task: Any, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` whose headers carry the task's payload version (a given one is kept: a
    replay sends the version its arguments are of)."""
    headers = options.get("headers") or {}
    if history.VERSION_HEADER in headers:
        return options
    version = task.spec.versions.version
    return {**options, "headers": {**headers, history.VERSION_HEADER: version}}


# -- the broker did not answer -----------------------------------------------------------------


def _is_connection_error(broker: Broker, exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError | TimeoutError | OperationalError) or broker.is_down(exc)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (Celery wraps a
    refused connection in a RuntimeError about its result store)."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def broker_down(broker: Broker, exc: BaseException) -> bool:
    """Whether ``exc``, or anything it was raised from, says the broker did not answer
    (the socket's own errors, kombu's, or those ``broker`` names)."""
    return any(_is_connection_error(broker, link) for link in _causes(exc))


def root_message(exc: BaseException, broker: Broker | None = None) -> str:
    """What ``exc`` comes down to: the innermost link that says the broker did not answer
    (an error it was raised while handling, such as the IndexError of kombu's empty channel
    list, is not the cause), else the innermost link."""
    chain = _causes(exc)
    if broker is not None:
        chain = [link for link in chain if _is_connection_error(broker, link)] or chain
    return str(chain[-1]).strip() or type(exc).__name__


def broker_unreachable(task: Any, exc: BaseException) -> DispatchError:
    """The error for a dispatch whose broker did not answer in ``JOBS_DISPATCH_TIMEOUT``."""
    settings = task.app.jobs_settings
    return DispatchError(
        f"{task.name}: the broker at {masked(settings.broker_url)} did not answer within "
        f"{settings.dispatch_timeout:g} s (JOBS_DISPATCH_TIMEOUT); nothing was enqueued: "
        f"{root_message(exc, brokers.of(task.app))}"
    )
