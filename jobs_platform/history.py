"""The attempt history that travels with a message in its headers (pure; JSON only).

Each failed attempt appends ``{"type", "message", "at", "attempt"}``; the dead-letter
table shows the whole list. Only the newest entries are kept so a header cannot grow
without bound (``attempt`` keeps the numbering exact).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs_platform.clock import utc_iso

ERRORS_HEADER = "jobs_errors"
ENQUEUED_HEADER = "jobs_enqueued_at"
#: Set by a dead-letter replay, so a replayed job that dies again links to its row.
REPLAY_OF_HEADER = "jobs_replay_of"
#: Request attribute where ReliableTask hands the failure it gave up on to the dead-letter
#: receiver, as the task raised it: Celery swaps an exception it cannot pickle (urllib's
#: HTTPError, httpx's HTTPStatusError) for a stand-in before ``task_failure`` fires.
FINAL_FAILURE_ATTR = "jobs_final_failure"
#: The outcomes a final failure can have (the dead-letter reason).
FINAL_OUTCOMES = ("exhausted", "permanent")
#: Entries kept per message; max_retries is capped at 1000 but headers must stay small.
MAX_ENTRIES = 50
MAX_MESSAGE_CHARS = 1000


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a class or function: how errors and tasks are named."""
    return f"{obj.__module__}.{obj.__qualname__}"


def describe(exc: BaseException, attempt: int, *, at: str | None = None) -> dict[str, Any]:
    return entry(qualified_name(type(exc)), str(exc), attempt, at=at)


def entry(type_name: str, message: str, attempt: int, *, at: str | None = None) -> dict[str, Any]:
    return {
        "type": type_name,
        "message": message[:MAX_MESSAGE_CHARS],
        "at": at or utc_iso(),
        "attempt": attempt,
    }


def note_final_failure(
    request: Any, item: dict[str, Any], *, status: int | None, outcome: str
) -> None:
    """Leave the final failure (a history ``item`` plus HTTP status and outcome) on the
    running task's request for the dead-letter receiver."""
    if outcome not in FINAL_OUTCOMES:
        raise ValueError(f"outcome must be one of {FINAL_OUTCOMES}, got {outcome!r}")
    setattr(request, FINAL_FAILURE_ATTR, {**item, "status": status, "outcome": outcome})


def final_failure(request: Any) -> dict[str, Any] | None:
    """The well-formed final failure noted on ``request``, else ``None``."""
    info = getattr(request, FINAL_FAILURE_ATTR, None)
    if not isinstance(info, dict) or info.get("outcome") not in FINAL_OUTCOMES:
        return None
    if not isinstance(info.get("type"), str) or not isinstance(info.get("message"), str):
        return None
    return info


def errors_of(headers: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    value = (headers or {}).get(ERRORS_HEADER) or []
    return list(value) if isinstance(value, list) else []


def with_error(headers: Mapping[str, Any] | None, item: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``headers`` with ``item`` appended to the history."""
    new = dict(headers or {})
    new[ERRORS_HEADER] = [*errors_of(headers), item][-MAX_ENTRIES:]
    return new
