"""The default classifier as a table: exception -> retry or fail (and why)."""

from __future__ import annotations

import email.message
import email.utils
import json
import socket
import urllib.error
from typing import Any

import pytest

from jobs_platform import PermanentError, TransientError
from jobs_platform.retry.classify import (
    Attempt,
    Fail,
    Retry,
    default_classifier,
    never_sent,
    retry_after_seconds,
)


class FakeResponse:
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        self.headers = headers or {}


class HTTPStatusError(Exception):
    """Shaped like requests/httpx errors: the status is on .response."""

    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"HTTP {status}")
        self.response = FakeResponse(status, headers)


def urllib_error(status: int, retry_after: str | None = None) -> urllib.error.HTTPError:
    headers = email.message.Message()
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return urllib.error.HTTPError("http://127.0.0.1/x", status, "err", headers, None)


class ValidationError(Exception):
    """Named like pydantic/marshmallow's."""


class OperationalError(Exception):
    pass


OperationalError.__module__ = "sqlalchemy.exc"


class AppError(Exception):
    pass


ATTEMPT = Attempt(task_name="t", number=1)

# (exception, expected decision type, the reason it gives)
CASES: list[tuple[BaseException, type, str]] = [
    (PermanentError("gone"), Fail, "PermanentError"),
    (TransientError("later"), Retry, "TransientError"),
    (ConnectionRefusedError(), Retry, "ConnectionRefusedError is transient"),
    (ConnectionResetError(), Retry, "ConnectionResetError is transient"),
    (TimeoutError(), Retry, "TimeoutError is transient"),
    # matched by qualified name, without importing SQLAlchemy:
    (OperationalError("server closed the connection"), Retry, "OperationalError is transient"),
    (urllib.error.URLError(ConnectionRefusedError()), Retry, "URLError(ConnectionRefusedError)"),
    (HTTPStatusError(500), Retry, "HTTP 500"),
    (HTTPStatusError(503), Retry, "HTTP 503"),
    (HTTPStatusError(408), Retry, "HTTP 408"),
    (HTTPStatusError(425), Retry, "HTTP 425"),
    (HTTPStatusError(429), Retry, "HTTP 429"),
    (HTTPStatusError(400), Fail, "HTTP 400"),
    (HTTPStatusError(404), Fail, "HTTP 404"),
    (HTTPStatusError(422), Fail, "HTTP 422"),
    (urllib_error(502), Retry, "HTTP 502"),
    (urllib_error(403), Fail, "HTTP 403"),
    (ValueError("bad amount"), Fail, "ValueError is a validation/decoding/argument error"),
    (json.JSONDecodeError("x", "doc", 0), Fail, "JSONDecodeError is a validation"),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), Fail, "UnicodeDecodeError is a valid"),
    (TypeError("missing argument"), Fail, "TypeError is a validation/decoding/argument error"),
    (ValidationError("field required"), Fail, "ValidationError is a validation"),
    # unknown: retried by default (the cap bounds it)
    (AppError("who knows"), Retry, "AppError is unclassified; retrying"),
    (KeyError("k"), Retry, "KeyError is unclassified; retrying"),
]


@pytest.mark.parametrize(("exc", "expected", "reason"), CASES, ids=lambda v: type(v).__name__)
def test_default_rules(exc: BaseException, expected: type, reason: str) -> None:
    decision = default_classifier(exc, ATTEMPT)
    assert isinstance(decision, expected)
    assert reason in decision.reason
    if isinstance(decision, Retry):
        assert decision.retry_after_s is None  # no Retry-After in these: the backoff decides


def test_unknown_errors_can_be_made_permanent() -> None:
    decision = default_classifier(AppError(), Attempt("t", 1, retry_unknown_errors=False))
    assert isinstance(decision, Fail)
    assert "unclassified" in decision.reason


def test_task_lists_win_over_builtin_rules() -> None:
    attempt = Attempt("t", 1, transient_errors=(ValueError,), permanent_errors=(TimeoutError,))
    assert isinstance(default_classifier(ValueError(), attempt), Retry)
    assert isinstance(default_classifier(TimeoutError(), attempt), Fail)
    # permanent_errors is checked first when both lists match.
    both = Attempt("t", 1, transient_errors=(AppError,), permanent_errors=(AppError,))
    assert isinstance(default_classifier(AppError(), both), Fail)


@pytest.mark.parametrize(
    ("exc", "seconds"),
    [
        (HTTPStatusError(429, {"Retry-After": "17"}), 17.0),
        (urllib_error(503, "5"), 5.0),
        (TransientError("x", retry_after_s=2.5), 2.5),
        (HTTPStatusError(503, {"Retry-After": "soon"}), None),
        (HTTPStatusError(503), None),
    ],
)
def test_retry_after_is_read(exc: BaseException, seconds: float | None) -> None:
    decision = default_classifier(exc, ATTEMPT)
    assert isinstance(decision, Retry)
    assert decision.retry_after_s == seconds


def test_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    header: dict[str, Any] = {"Retry-After": email.utils.formatdate(now + 30, usegmt=True)}
    assert retry_after_seconds(HTTPStatusError(503, header), now=now) == pytest.approx(30, abs=1)
    past = {"Retry-After": email.utils.formatdate(now - 30, usegmt=True)}
    assert retry_after_seconds(HTTPStatusError(503, past), now=now) == 0


def _wrapped(cause: BaseException) -> RuntimeError:
    try:
        raise RuntimeError("client failed") from cause
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ConnectionRefusedError(), True),
        (socket.gaierror(-2, "Name or service not known"), True),
        (urllib.error.URLError(ConnectionRefusedError()), True),
        (_wrapped(ConnectionRefusedError()), True),
        (urllib.error.URLError(TimeoutError("timed out")), False),  # may have been sent
        (ConnectionResetError(), False),
        (TimeoutError(), False),
        (HTTPStatusError(503), False),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v),
)
def test_never_sent(exc: BaseException, expected: bool) -> None:
    assert never_sent(exc) is expected
