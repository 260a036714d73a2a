"""What the exporter reads from the outbox, and what the maintenance schedule prunes."""

from __future__ import annotations

import dataclasses
import datetime as dt

import sqlalchemy as sa

from jobs_platform.clock import as_utc, utcnow
from jobs_platform.outbox.model import job_outbox


@dataclasses.dataclass(frozen=True)
class Backlog:
    """Committed rows no relay has published yet."""

    depth: int
    oldest_age_s: float  # 0 when there are none


def backlog(conn: sa.Connection, now: dt.datetime | None = None) -> Backlog:
    """One query over the unpublished rows (the partial index keeps it small)."""
    c = job_outbox.c
    count, oldest = conn.execute(
        sa.select(sa.func.count(), sa.func.min(c.created_at)).where(c.published_at.is_(None))
    ).one()
    if oldest is None:
        return Backlog(int(count), 0.0)
    age = ((now or utcnow()) - as_utc(oldest)).total_seconds()
    return Backlog(int(count), max(0.0, age))


def prune(engine: sa.Engine, retention_s: float, now: dt.datetime | None = None) -> int:
    """Delete rows published more than ``retention_s`` ago; how many went."""
    cutoff = (now or utcnow()) - dt.timedelta(seconds=retention_s)
    with engine.begin() as conn:
        result = conn.execute(sa.delete(job_outbox).where(job_outbox.c.published_at < cutoff))
    return int(result.rowcount or 0)
