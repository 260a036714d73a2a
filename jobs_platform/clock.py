"""Time in one place: every stored or sent time is an aware UTC datetime (pure).

SQLite hands back naive datetimes and Celery reads a naive ETA as UTC (``enable_utc`` is
pinned), so "naive" always means UTC here.
"""

from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` as aware UTC: a naive one is taken to be UTC, an aware one converted."""
    return moment.astimezone(dt.UTC) if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def utc_iso(moment: dt.datetime | None = None) -> str:
    """ISO 8601 with milliseconds and offset (``2026-12-02T18:00:00.000+00:00``)."""
    return as_utc(moment or utcnow()).isoformat(timespec="milliseconds")


def unix_time(iso: str) -> float | None:
    """Unix time of an ISO 8601 string (UTC when it has no offset), ``None`` if it is not one."""
    try:
        return as_utc(dt.datetime.fromisoformat(iso)).timestamp()
    except ValueError:
        return None
