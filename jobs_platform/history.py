"""The attempt history that travels with a message in its headers (pure; JSON only).

Each failed attempt appends ``{"type", "message", "at", "attempt"}``; the dead-letter
table shows the whole list. Only the newest entries are kept so a header cannot grow
without bound (``attempt`` keeps the numbering exact).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

ERRORS_HEADER = "jobs_errors"
ENQUEUED_HEADER = "jobs_enqueued_at"
#: Entries kept per message; max_retries is capped at 1000 but headers must stay small.
MAX_ENTRIES = 50
MAX_MESSAGE_CHARS = 1000


def utcnow_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def describe(exc: BaseException, attempt: int, *, at: str | None = None) -> dict[str, Any]:
    cls = type(exc)
    return entry(f"{cls.__module__}.{cls.__qualname__}", str(exc), attempt, at=at)


def entry(type_name: str, message: str, attempt: int, *, at: str | None = None) -> dict[str, Any]:
    return {
        "type": type_name,
        "message": message[:MAX_MESSAGE_CHARS],
        "at": at or utcnow_iso(),
        "attempt": attempt,
    }


def errors_of(headers: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    value = (headers or {}).get(ERRORS_HEADER) or []
    return list(value) if isinstance(value, list) else []


def with_error(headers: Mapping[str, Any] | None, item: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``headers`` with ``item`` appended to the history."""
    new = dict(headers or {})
    new[ERRORS_HEADER] = [*errors_of(headers), item][-MAX_ENTRIES:]
    return new
