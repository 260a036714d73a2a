"""What ``batch list/show``, the exporter and the maintenance schedule read (SQLAlchemy Core)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import sqlalchemy as sa

from jobs_platform import db
from jobs_platform.batches.model import batches, members
from jobs_platform.clock import as_utc, utcnow

B = batches.c
M = members.c
STATUSES = ("running", "succeeded", "failed", "cancelled")


@dataclasses.dataclass(frozen=True)
class BatchState:
    id: str
    name: str
    status: str
    total: int
    pending: int
    succeeded: int
    dead: int
    cancelled: int
    created_at: dt.datetime
    completed_at: dt.datetime | None
    succeeded_at: dt.datetime | None
    failed_at: dt.datetime | None
    cancelled_at: dt.datetime | None
    cancel_reason: str | None
    callbacks: tuple[str, ...]
    #: ``{member id: dead letter id}`` of the members dead now (filled by :func:`get`).
    dead_letters: dict[str, int | None] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        for key, value in data.items():
            if isinstance(value, dt.datetime):
                data[key] = value.isoformat()
        data["callbacks"] = list(self.callbacks)
        return data


def status_of(pending: int, dead: int, cancelled: int, cancelled_at: Any) -> str:
    """``cancelled`` once cancel was asked; else ``running`` while members are pending, then
    ``failed`` (settled with dead members), ``cancelled`` (settled with cancelled members: the
    members a broker failure left unsent) or ``succeeded`` (every member succeeded: exactly
    when ``on_success`` is due)."""
    if cancelled_at is not None:
        return "cancelled"
    if pending:
        return "running"
    if dead:
        return "failed"
    return "cancelled" if cancelled else "succeeded"


def _where_status(status: str) -> Any:
    """:func:`status_of` as a SQL condition (so ``--status`` and ``--limit`` go together)."""
    asked = B.cancelled_at.is_not(None)
    if status == "cancelled":
        return sa.or_(asked, sa.and_(B.pending == 0, B.dead == 0, B.cancelled > 0))
    settled = sa.and_(~asked, B.pending == 0)
    if status == "running":
        return sa.and_(~asked, B.pending > 0)
    if status == "failed":
        return sa.and_(settled, B.dead > 0)
    if status == "succeeded":
        return sa.and_(settled, B.dead == 0, B.cancelled == 0)
    raise ValueError(f"a batch's status is one of {STATUSES}, not {status!r}")


_COLUMNS = (
    B.id,
    B.name,
    B.total,
    B.pending,
    B.succeeded,
    B.dead,
    B.cancelled,
    B.created_at,
    B.completed_at,
    B.succeeded_at,
    B.failed_at,
    B.cancelled_at,
    B.cancel_reason,
    B.callbacks,
)


def _state(row: Any) -> BatchState:
    import json

    def ts(value: Any) -> dt.datetime | None:
        return None if value is None else as_utc(value)

    return BatchState(
        id=row.id,
        name=row.name,
        status=status_of(row.pending, row.dead, row.cancelled, row.cancelled_at),
        total=int(row.total),
        pending=int(row.pending),
        succeeded=int(row.succeeded),
        dead=int(row.dead),
        cancelled=int(row.cancelled),
        created_at=as_utc(row.created_at),
        completed_at=ts(row.completed_at),
        succeeded_at=ts(row.succeeded_at),
        failed_at=ts(row.failed_at),
        cancelled_at=ts(row.cancelled_at),
        cancel_reason=row.cancel_reason,
        callbacks=tuple(sorted(json.loads(row.callbacks or "{}"))),
    )


def get(app: Any, batch_id: str, *, engine: sa.Engine | None = None) -> BatchState | None:
    """The batch with the dead letters of its dead members, or ``None``."""
    engine = engine or db.engine_for(app.jobs_settings.database_url)
    with engine.connect() as conn:
        row = conn.execute(sa.select(*_COLUMNS).where(B.id == batch_id)).first()
        if row is None:
            return None
        dead = conn.execute(
            sa.select(M.member_id, M.dead_letter_id)
            .where(M.batch_id == batch_id, M.outcome == "dead")
            .order_by(M.member_id)
        ).all()
    state = _state(row)
    state.dead_letters.update({r.member_id: r.dead_letter_id for r in dead})
    return state


def listing(
    app: Any, *, status: str | None = None, limit: int = 50, engine: sa.Engine | None = None
) -> list[BatchState]:
    """The newest ``limit`` batches first (of ``status``, if given)."""
    engine = engine or db.engine_for(app.jobs_settings.database_url)
    query = sa.select(*_COLUMNS).order_by(B.created_at.desc(), B.id).limit(limit)
    if status is not None:
        query = query.where(_where_status(status))
    with engine.connect() as conn:
        return [_state(r) for r in conn.execute(query)]


@dataclasses.dataclass(frozen=True)
class Open:
    """Batches not settled yet and their pending members (for metrics)."""

    batches: int
    pending: int


def open_batches(conn: sa.Connection) -> Open:
    count, pending = conn.execute(
        sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(B.pending), 0)).where(
            B.completed_at.is_(None)
        )
    ).one()
    return Open(int(count), int(pending))


def prune(engine: sa.Engine, retention_s: float, now: dt.datetime | None = None) -> int:
    """Delete batches settled (``completed_at``) more than ``retention_s`` ago with their
    members' outcomes; how many batches went. Running batches are kept however old; a
    settled one with dead members goes too (a replay after that runs, counted nowhere)."""
    cutoff = (now or utcnow()) - dt.timedelta(seconds=retention_s)
    old = sa.select(B.id).where(B.completed_at < cutoff, B.pending == 0)
    with engine.begin() as conn:
        conn.execute(sa.delete(members).where(M.batch_id.in_(old)))
        result = conn.execute(sa.delete(batches).where(B.id.in_(old)))
    return int(result.rowcount or 0)
