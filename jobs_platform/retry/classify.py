"""Transient-vs-permanent classification: one pure ``classifier(exc, attempt) -> Decision``.

An error is retried only when retrying can help: the call never reached the other
side (connection refused/reset, DNS, timeouts), or the other side asked us to come
back later (HTTP 408/425/429/5xx, honouring ``Retry-After``). Errors that will fail
the same way every time (HTTP 4xx, validation and decoding errors, wrong arguments)
fail at once. Anything else is retried by default (the policy cap bounds it); set
``retry_unknown_errors`` off to fail unknown errors at once instead.

Third-party exception types are recognised by qualified class name so that this
module imports none of those libraries.
"""

from __future__ import annotations

import dataclasses
import email.utils
import socket
import time
import urllib.error
from collections.abc import Callable, Mapping
from typing import TypeAlias

from jobs_platform.errors import PermanentError, TransientError
from jobs_platform.history import qualified_name

ExcTypes: TypeAlias = tuple[type[BaseException], ...]


@dataclasses.dataclass(frozen=True)
class Facts:
    """What an exception says about itself: its HTTP status and a ``Retry-After``."""

    status: int | None = None
    retry_after_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Attempt:
    """What a classifier knows about the attempt that just failed."""

    task_name: str
    number: int  # 1 = the first run
    transient_errors: ExcTypes = ()
    permanent_errors: ExcTypes = ()
    retry_unknown_errors: bool = True
    #: The exception's :class:`Facts`, read once for the whole decision (None: not read yet).
    facts: Facts | None = None


@dataclasses.dataclass(frozen=True)
class Retry:
    """Retry after the policy's backoff (or ``retry_after_s``, capped by the policy)."""

    reason: str
    retry_after_s: float | None = None


@dataclasses.dataclass(frozen=True)
class Fail:
    """Fail now: retrying cannot help."""

    reason: str


Decision: TypeAlias = Retry | Fail
Classifier: TypeAlias = Callable[[BaseException, Attempt], Decision]

#: HTTP statuses that mean "try again later"; every other 4xx is the caller's fault.
RETRYABLE_STATUSES = frozenset({408, 425, 429})

#: Transient by type: the side effect cannot have happened or the operation is safe to redo.
TRANSIENT_TYPES: ExcTypes = (ConnectionError, TimeoutError)
TRANSIENT_NAMES = frozenset(
    {
        "redis.exceptions.ConnectionError",
        "redis.exceptions.TimeoutError",
        "kombu.exceptions.OperationalError",
        "sqlalchemy.exc.OperationalError",
        "sqlalchemy.exc.DisconnectionError",
        "sqlalchemy.exc.TimeoutError",
        "psycopg.OperationalError",
        "billiard.exceptions.SoftTimeLimitExceeded",
        "urllib3.exceptions.NewConnectionError",
        "urllib3.exceptions.ProtocolError",
        "requests.exceptions.ConnectionError",
        "requests.exceptions.Timeout",
        "httpx.TransportError",
    }
)

#: Permanent by type: validation, decoding and wrong-argument errors fail the same way every time.
PERMANENT_TYPES: ExcTypes = (ValueError, TypeError)
PERMANENT_SHORT_NAMES = frozenset({"ValidationError"})


#: Errors raised before a request left this machine: retrying them cannot repeat a side effect.
NEVER_SENT_TYPES: ExcTypes = (ConnectionRefusedError, socket.gaierror)
NEVER_SENT_NAMES = frozenset(
    {
        "urllib3.exceptions.NewConnectionError",
        "urllib3.exceptions.NameResolutionError",
        "urllib3.exceptions.ConnectTimeoutError",
        "requests.exceptions.ConnectTimeout",
        "httpx.ConnectError",
        "httpx.ConnectTimeout",
    }
)


def never_sent(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) proves the request never reached the other side.

    Unlike a read timeout or a reset connection, after which the server may already have
    acted, these are safe to retry even for a non-idempotent call (a POST, a charge).
    """
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, NEVER_SENT_TYPES) or _qualified_names(item) & NEVER_SENT_NAMES:
            return True
        # urllib/urllib3/requests wrap the cause: URLError.reason, MaxRetryError.reason, or an
        # explicit `raise ... from exc`. An implicit __context__ is not followed: it may be an
        # earlier, unrelated failure.
        todo += [getattr(item, "reason", None), item.__cause__]
        todo += [arg for arg in item.args if isinstance(arg, BaseException)]
    return False


def _qualified_names(exc: BaseException) -> set[str]:
    return {qualified_name(cls) for cls in type(exc).__mro__}


def http_status(exc: BaseException) -> int | None:
    """The HTTP status carried by ``exc`` (requests/httpx/urllib style), if any."""
    for obj in (exc, getattr(exc, "response", None)):
        if obj is None:
            continue
        for attr in ("status_code", "status"):
            value = getattr(obj, attr, None)
            if isinstance(value, int) and 100 <= value <= 599:
                return value
        code = getattr(obj, "code", None)  # urllib.error.HTTPError
        if hasattr(obj, "headers") and isinstance(code, int) and 100 <= code <= 599:
            return code
    return None


def retry_after_seconds(exc: BaseException, *, now: float | None = None) -> float | None:
    """Parse ``Retry-After`` (delta-seconds or HTTP-date) from the exception's response headers."""
    if isinstance(exc, TransientError) and exc.retry_after_s is not None:
        return exc.retry_after_s
    for obj in (exc, getattr(exc, "response", None)):
        headers = getattr(obj, "headers", None)
        if not isinstance(headers, Mapping) and not hasattr(headers, "get"):
            continue
        raw = headers.get("Retry-After") if headers is not None else None
        if raw is None:
            continue
        return _parse_retry_after(str(raw), now=now)
    return None


def _parse_retry_after(raw: str, *, now: float | None) -> float | None:
    raw = raw.strip()
    if raw.isdigit():
        return float(raw)
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def facts_of(exc: BaseException) -> Facts:
    """The exception's HTTP status and ``Retry-After`` (read once per failed attempt)."""
    return Facts(http_status(exc), retry_after_seconds(exc))


def _by_http_status(facts: Facts) -> Decision | None:
    status = facts.status
    if status is None:
        return None
    if status in RETRYABLE_STATUSES or status >= 500:
        return Retry(f"HTTP {status}", facts.retry_after_s)
    if 400 <= status < 500:
        return Fail(f"HTTP {status}")
    return None


def _by_type(exc: BaseException) -> Decision | None:
    names = _qualified_names(exc)
    if isinstance(exc, TRANSIENT_TYPES) or names & TRANSIENT_NAMES:
        return Retry(f"{type(exc).__name__} is transient")
    if isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, OSError):
        return Retry(f"URLError({type(exc.reason).__name__}) is transient")
    if isinstance(exc, PERMANENT_TYPES) or any(
        cls.__name__ in PERMANENT_SHORT_NAMES for cls in type(exc).__mro__
    ):
        return Fail(f"{type(exc).__name__} is a validation/decoding/argument error")
    return None


def default_classifier(exc: BaseException, attempt: Attempt) -> Decision:
    """The platform's rules, most specific first (see the module docstring)."""
    if attempt.permanent_errors and isinstance(exc, attempt.permanent_errors):
        return Fail(f"{type(exc).__name__} is listed in permanent_errors")
    facts = attempt.facts or facts_of(exc)
    if attempt.transient_errors and isinstance(exc, attempt.transient_errors):
        return Retry(f"{type(exc).__name__} is listed in transient_errors", facts.retry_after_s)
    if isinstance(exc, PermanentError):
        return Fail("PermanentError")
    if isinstance(exc, TransientError):
        return Retry("TransientError", exc.retry_after_s)
    decision = _by_http_status(facts) or _by_type(exc)
    if decision is not None:
        return decision
    if attempt.retry_unknown_errors:
        return Retry(f"{type(exc).__name__} is unclassified; retrying (retry_unknown_errors)")
    return Fail(f"{type(exc).__name__} is unclassified; not retrying (retry_unknown_errors off)")
