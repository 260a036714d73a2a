"""Dead letters in tests: a :class:`DeadLetter` factory, and the assertion that a job died.

Both import the dead-letter modules when called, not when this module is imported, so the
pytest plugin that re-exports them costs no SQLAlchemy at collection.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import difflib
import uuid
from typing import TYPE_CHECKING, Any

from jobs_platform.clock import utc_iso, utcnow
from jobs_platform.history import entry
from jobs_platform.testing.processes import wait_for
from jobs_platform.urls import masked

if TYPE_CHECKING:
    from jobs_platform.deadletter.record import DeadLetter

DEFAULT_ERROR_TYPE = "builtins.ConnectionError"
DEFAULT_MESSAGE = "connection refused"


def dead_letter(
    *,
    message: str | None = None,
    error_type: str | None = None,
    http_status: int | None = None,
    **overrides: Any,
) -> DeadLetter:
    """A :class:`~jobs_platform.deadletter.record.DeadLetter` as the platform would record it.

    Defaults: a ``billing.charge`` job on ``fast`` that ran out of retries (``exhausted``)
    just now after one attempt failing with ``builtins.ConnectionError: connection
    refused``, called with no arguments. Every ``task_id`` is a new UUID, so letters made
    in a loop are distinct rows when stored.

    ``overrides`` set any :class:`DeadLetter` field. The attempt history follows
    ``attempts`` (one entry per attempt, numbered from 1, each at ``failed_at``) unless
    ``errors`` is given; ``message``, ``error_type`` and ``http_status`` shape those entries
    (the last one carries the HTTP status, as a real final failure does).
    """
    from jobs_platform.deadletter.record import DeadLetter

    fields = {f.name for f in dataclasses.fields(DeadLetter)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        hints = {name: difflib.get_close_matches(name, fields, n=1) for name in unknown}
        hint = "; ".join(f"{n!r}: did you mean {h[0]!r}?" for n, h in hints.items() if h)
        raise TypeError(
            f"dead_letter() got unknown field(s) {unknown}" + (f" ({hint})" if hint else "")
        )
    shaped = {"message": message, "error_type": error_type, "http_status": http_status}
    if "errors" in overrides and any(v is not None for v in shaped.values()):
        given = sorted(k for k, v in shaped.items() if v is not None)
        raise TypeError(f"dead_letter(): pass errors= or {', '.join(given)}, not both")

    failed_at: dt.datetime = overrides.get("failed_at") or utcnow()
    attempts = overrides.get("attempts", 1)
    values: dict[str, Any] = {
        "reason": "exhausted",
        "task_id": str(uuid.uuid4()),
        "task_name": "billing.charge",
        "queue": "fast",
        "failed_at": failed_at,
        "attempts": attempts,
        "args": [],
        "kwargs": {},
    }
    if "errors" not in overrides:
        values["errors"] = _history(
            error_type or DEFAULT_ERROR_TYPE,
            DEFAULT_MESSAGE if message is None else message,
            attempts=attempts if isinstance(attempts, int) else 1,
            at=utc_iso(failed_at),
            http_status=http_status,
        )
    values.update(overrides)
    return DeadLetter(**values)


def _history(
    error_type: str, message: str, *, attempts: int, at: str, http_status: int | None
) -> list[dict[str, Any]]:
    items = [entry(error_type, message, n, at=at) for n in range(1, attempts + 1)]
    if items and http_status is not None:
        items[-1]["status"] = http_status
    return items


def assert_dead_lettered(
    app: Any,
    task_id: str,
    *,
    reason: str | None = None,
    timeout_s: float = 30.0,
    interval_s: float = 0.1,
) -> dict[str, Any]:
    """Wait until ``task_id`` has a dead-letter row (with ``reason``, if given); return it.

    ``app`` is the app created with ``create_app`` (its ``JOBS_DATABASE_URL`` is read) or
    a database URL. Fails with :class:`AssertionError` listing the rows found for the task
    at once when they all have another reason (a job dies once: waiting cannot change it),
    or when none arrived by the deadline.
    """
    __tracebackhide__ = True  # pytest shows the test's line, not this helper's
    url = _database_url(app)
    from jobs_platform.deadletter.store import DeadLetterStore

    store = DeadLetterStore(url)
    wanted = "" if reason is None else f" with reason {reason!r}"

    def row() -> dict[str, Any] | None:
        rows = store.by_task_id(task_id)
        match = next((r for r in rows if reason is None or r["reason"] == reason), None)
        if match is None and rows:
            raise AssertionError(
                f"task {task_id} was dead-lettered, but not{wanted}:\n{_describe(rows)}"
            )
        return match

    try:
        return wait_for(row, timeout_s=timeout_s, interval_s=interval_s)
    except TimeoutError:
        raise AssertionError(
            f"no dead letter{wanted} for task {task_id} in {masked(url)} after {timeout_s:g} s "
            "(is a worker consuming the task's queue, with the same JOBS_DATABASE_URL?)"
        ) from None


def _database_url(app: Any) -> str:
    if isinstance(app, str):
        return app
    settings = getattr(app, "jobs_settings", None)
    url = getattr(settings, "database_url", None)
    if not isinstance(url, str):
        raise TypeError(
            f"expected an app made by jobs_platform.create_app() or a database URL, got {app!r}"
        )
    return url


def _describe(rows: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"  #{r.get('id')} reason={r.get('reason')} status={r.get('status')} "
        f"task={r.get('task_name')} attempts={r.get('attempts')} "
        f"error={r.get('error_type')}: {str(r.get('error_message') or '')[:200]}"
        for r in rows
    )
