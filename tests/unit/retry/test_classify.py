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

# (exception, expected decision type)
CASES: list[tuple[BaseException, type]] = [
    (PermanentError("gone"), Fail),
    (TransientError("later"), Retry),
    (ConnectionRefusedError(), Retry),
    (ConnectionResetError(), Retry),
    (TimeoutError(), Retry),
    (TimeoutError(), Retry),
    (OperationalError("server closed the connection"), Retry),  # matched by qualified name
    (urllib.error.URLError(ConnectionRefusedError()), Retry),
    (HTTPStatusError(500), Retry),
    (HTTPStatusError(503), Retry),
    (HTTPStatusError(408), Retry),
    (HTTPStatusError(425), Retry),
    (HTTPStatusError(429), Retry),
    (HTTPStatusError(400), Fail),
    (HTTPStatusError(404), Fail),
    (HTTPStatusError(422), Fail),
    (urllib_error(502), Retry),
    (urllib_error(403), Fail),
    (ValueError("bad amount"), Fail),
    (json.JSONDecodeError("x", "doc", 0), Fail),
    (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), Fail),
    (TypeError("missing argument"), Fail),
    (ValidationError("field required"), Fail),
    (AppError("who knows"), Retry),  # unknown: retried by default (the cap bounds it)
    (KeyError("k"), Retry),
]


@pytest.mark.parametrize(("exc", "expected"), CASES, ids=lambda v: type(v).__name__)
def test_default_rules(exc: BaseException, expected: type) -> None:
    assert isinstance(default_classifier(exc, ATTEMPT), expected)


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
