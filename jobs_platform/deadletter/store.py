"""Reads and writes of ``dead_letter_jobs`` (SQLAlchemy Core; no Celery).

Every write is conditional, so it is safe to repeat: :meth:`DeadLetterStore.add` ignores a
dead letter whose ``dedupe_key`` is already stored, and replay/discard only move rows that
are still ``dead`` (a second replay of the same row finds nothing to do). ``dlq stats``
reads ``dead_letter_counts``, which the database keeps with every write to the rows
(:mod:`jobs_platform.deadletter.counts`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa

from jobs_platform import history
from jobs_platform.batches import counting
from jobs_platform.clock import as_utc, utcnow
from jobs_platform.db import engine_for, insert_ignoring
from jobs_platform.deadletter import counts
from jobs_platform.deadletter.model import DeadLetterJob
from jobs_platform.deadletter.record import DeadLetter, parse_time

TABLE: sa.Table = DeadLetterJob.__table__  # type: ignore[assignment]
C = TABLE.c
COUNTED = counts.COUNTS.c
DATETIME_COLUMNS = ("enqueued_at", "failed_at", "resolved_at")


@dataclasses.dataclass(frozen=True)
class Filter:
    """Which rows a listing or a bulk operation applies to (``None`` means any)."""

    task: str | None = None
    queue: str | None = None
    reason: str | None = None
    status: str | None = None
    fingerprint: str | None = None
    since: dt.datetime | None = None
    ids: tuple[int, ...] | None = None

    @property
    def counted(self) -> bool:
        """Whether the group counts can answer for this filter (they have no times or ids)."""
        return self.since is None and self.ids is None

    def where(self) -> list[sa.ColumnElement[bool]]:
        clauses: list[sa.ColumnElement[bool]] = []
        for name in ("queue", "reason", "status", "fingerprint"):
            value = getattr(self, name)
            if value is not None:
                clauses.append(C[name] == value)
        if self.task is not None:
            clauses.append(C.task_name == self.task)
        if self.since is not None:
            clauses.append(C.failed_at >= as_utc(self.since))
        if self.ids is not None:
            clauses.append(C.id.in_(self.ids))
        return clauses


@dataclasses.dataclass(frozen=True)
class Stats:
    total: int
    by_status: dict[str, int]
    by_task: list[dict[str, Any]]
    by_fingerprint: list[dict[str, Any]]


#: Outcomes of a bulk operation that did (or, in a dry run, would do) what was asked.
DONE = frozenset({"replayed", "would_replay"})


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a replay or discard came to for one row.

    ``outcome``: ``replayed`` / ``would_replay`` (done), or ``missing``,
    ``already_resolved``, ``refused``, ``failed``, ``not_attempted`` (refused).
    """

    id: int
    outcome: str
    #: Why it was refused or failed (for a person).
    why: str | None = None
    #: The new task id of a replay.
    task_id: str | None = None
    #: What a dry run would send: task_name, queue, args, kwargs.
    would_send: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        return self.outcome in DONE


def batch_member(letter: DeadLetter) -> tuple[str, str] | None:
    """``(batch id, member id)`` of a letter of a batch member, else ``None``."""
    headers = letter.headers if isinstance(letter.headers, dict) else {}
    batch_id = headers.get(history.BATCH_HEADER)
    member_id = headers.get(history.BATCH_MEMBER_HEADER) or letter.task_id
    if not isinstance(batch_id, str) or not isinstance(member_id, str) or not member_id:
        return None
    return batch_id, member_id


def row_dict(row: Any) -> dict[str, Any]:
    """A plain dict of a row, with aware UTC datetimes on every dialect."""
    data = dict(row)
    for name in DATETIME_COLUMNS:
        data[name] = parse_time(data.get(name))
    return data


class DeadLetterStore:
    """The dead-letter table behind one database URL."""

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def engine(self) -> sa.Engine:
        return engine_for(self.url)  # per process: safe after a fork

    # -- writes ------------------------------------------------------------------------

    def add(self, letter: DeadLetter) -> int | None:
        """Store ``letter``; its new id, or ``None`` if this chain is already stored."""
        values = letter.row()
        for name in DATETIME_COLUMNS:
            if values.get(name) is not None:
                values[name] = as_utc(values[name])
        if values.get("replay_of") is not None:
            # The parent row may have been purged since (its children's link is ON DELETE
            # SET NULL): link only to a row that exists, instead of a foreign-key error.
            parent = sa.select(C.id).where(C.id == values["replay_of"]).scalar_subquery()
            values["replay_of"] = parent
        with self.engine.begin() as conn:
            stmt = insert_ignoring(conn, TABLE, values, unique=["dedupe_key"]).returning(C.id)
            new_id = conn.execute(stmt).scalar()
            if new_id is None:
                return None
            # A batch member's death is counted in the transaction that stores its letter:
            # every terminal path ends here, once per chain (jobs_platform.batches).
            member = batch_member(letter)
            if member is not None:
                counting.record(
                    conn,
                    member[0],
                    member[1],
                    "dead",
                    task_name=letter.task_name,
                    dead_letter_id=int(new_id),
                )
            return int(new_id)

    def replay(
        self,
        row_id: int,
        *,
        reason: str,
        actor: str,
        publish: Callable[[dict[str, Any], str], None],
    ) -> str | None:
        """Mark row ``row_id`` replayed and call ``publish(row, new_task_id)``, atomically.

        The conditional UPDATE holds the row until ``publish`` returns: a concurrent or
        repeated replay finds the row no longer ``dead`` and returns ``None`` without
        publishing; if ``publish`` raises, the row stays ``dead``.
        """
        new_task_id = str(uuid.uuid4())
        with self.engine.begin() as conn:
            moved = conn.execute(
                sa.update(TABLE)
                .where(C.id == row_id, C.status == "dead")
                .values(
                    status="replayed",
                    replayed_task_id=new_task_id,
                    resolution_reason=reason,
                    resolved_by=actor,
                    resolved_at=utcnow(),
                )
            ).rowcount
            if moved != 1:
                return None
            row = conn.execute(sa.select(TABLE).where(C.id == row_id)).mappings().one()
            publish(row_dict(row), new_task_id)
        return new_task_id

    def discard(self, ids: list[int], *, reason: str, actor: str) -> int:
        """Mark the still-``dead`` rows among ``ids`` discarded; how many moved."""
        if not ids:
            return 0
        with self.engine.begin() as conn:
            return int(
                conn.execute(
                    sa.update(TABLE)
                    .where(C.id.in_(ids), C.status == "dead")
                    .values(
                        status="discarded",
                        resolution_reason=reason,
                        resolved_by=actor,
                        resolved_at=utcnow(),
                    )
                ).rowcount
            )

    def purge(self, older_than: dt.datetime, *, statuses: tuple[str, ...]) -> int:
        """Delete rows with one of ``statuses`` that failed before ``older_than``."""
        with self.engine.begin() as conn:
            return int(
                conn.execute(
                    sa.delete(TABLE).where(C.failed_at < as_utc(older_than), C.status.in_(statuses))
                ).rowcount
            )

    def recount(self) -> int:
        """Rebuild the group counts from the rows (after hand edits); how many groups."""
        with self.engine.begin() as conn:
            return counts.recount(conn)

    # -- reads -------------------------------------------------------------------------

    def _has_counts(self) -> bool:
        """Whether migration 0003 ran (a reader may be newer than the database it reads)."""
        with self.engine.connect() as conn:
            return sa.inspect(conn).has_table(counts.COUNTS.name)

    def has_table(self) -> bool:
        """Whether the table exists (raises when the database cannot be reached)."""
        with self.engine.connect() as conn:
            return sa.inspect(conn).has_table(TABLE.name)

    def get(self, row_id: int) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(TABLE).where(C.id == row_id)).mappings().first()
        return None if row is None else row_dict(row)

    def by_task_id(self, task_id: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = (
                conn.execute(sa.select(TABLE).where(C.task_id == task_id).order_by(C.id))
                .mappings()
                .all()
            )
        return [row_dict(r) for r in rows]

    def listing(
        self,
        where: Filter = Filter(),
        *,
        page: int = 1,
        page_size: int = 50,
    ) -> list[dict[str, Any]]:
        """One page of rows, newest failure first."""
        stmt = (
            sa.select(TABLE)
            .where(*where.where())
            .order_by(C.failed_at.desc(), C.id.desc())
            .limit(page_size)
            .offset(max(page - 1, 0) * page_size)
        )
        with self.engine.connect() as conn:
            return [row_dict(r) for r in conn.execute(stmt).mappings().all()]

    def ids(self, where: Filter, *, batch: int = 500) -> Iterator[list[int]]:
        """The ids matching ``where``, oldest first, in batches (for bulk operations)."""
        last = 0
        while True:
            with self.engine.connect() as conn:
                chunk = list(
                    conn.execute(
                        sa.select(C.id)
                        .where(*where.where(), C.id > last)
                        .order_by(C.id)
                        .limit(batch)
                    ).scalars()
                )
            if not chunk:
                return
            yield [int(i) for i in chunk]
            last = int(chunk[-1])

    def count(self, where: Filter = Filter()) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).select_from(TABLE).where(*where.where())
                ).scalar_one()
            )

    def stats(self, where: Filter = Filter(), *, top: int = 20, exact: bool = False) -> Stats:
        """Counts by status, by task and by (task, fingerprint), largest groups first.

        Read from the group counts unless ``where`` has a time or ids (or ``exact``): then
        from the rows, a GROUP BY over every row that matches.
        """
        if where.counted and not exact and self._has_counts():
            source, n = counts.COUNTS, sa.func.sum(COUNTED.count).label("n")
            newest = sa.func.max(COUNTED.last_id).label("sample")
            clauses = [
                COUNTED[name if name != "task" else "task_name"] == getattr(where, name)
                for name in ("status", "task", "queue", "reason", "fingerprint")
                if getattr(where, name) is not None
            ]
        else:
            source, n = TABLE, sa.func.count().label("n")
            newest = sa.func.max(C.id).label("sample")
            clauses = where.where()
        col = source.c
        with self.engine.connect() as conn:
            by_status = {
                str(s): int(c)
                for s, c in conn.execute(
                    sa.select(col.status, n).where(*clauses).group_by(col.status)
                ).all()
                if c
            }
            # One pass (over the group counts, or the (status, task, fingerprint, id) index)
            # gives both groupings.
            all_groups = conn.execute(
                sa.select(col.task_name, col.fingerprint, n, newest)
                .where(*clauses)
                .group_by(col.task_name, col.fingerprint)
            ).all()
            tasks: dict[str, int] = {}
            for g in all_groups:
                tasks[g.task_name] = tasks.get(g.task_name, 0) + int(g.n)
            by_task = [
                {"task_name": t, "count": c}
                for t, c in sorted(tasks.items(), key=lambda item: (-item[1], item[0]))[:top]
            ]
            groups = sorted(all_groups, key=lambda g: (-int(g.n), g.task_name))[:top]
            samples = {
                int(r.id): r
                for r in conn.execute(
                    sa.select(C.id, C.error_type, C.error_message, C.failed_at).where(
                        C.id.in_([int(g.sample or 0) for g in groups])
                    )
                ).all()
            }
        by_fingerprint = []
        for g in groups:
            sample = samples.get(int(g.sample or 0))
            by_fingerprint.append(
                {
                    "task_name": g.task_name,
                    "fingerprint": g.fingerprint,
                    "count": int(g.n),
                    "error_type": sample.error_type if sample else "",
                    "error_message": (sample.error_message if sample else "")[:200],
                    "last_failed_at": parse_time(sample.failed_at) if sample else None,
                }
            )
        return Stats(sum(by_status.values()), by_status, by_task, by_fingerprint)
