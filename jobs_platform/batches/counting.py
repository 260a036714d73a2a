"""A member's outcome and the batch's counters, in one transaction (SQLAlchemy Core; no Celery).

:func:`record` runs inside the caller's transaction: the worker's own after a member's body
returned (or before it would run, for a cancelled batch), and the dead-letter store's, in
the transaction that inserts the member's dead letter. In that transaction:

1. the member's outcome is written under the primary key (batch, member): a redelivered
   or twice-run member finds it there and changes nothing (``INSERT ... ON CONFLICT DO
   NOTHING``, or a conditional ``UPDATE`` from ``pending``, or from ``dead`` to
   ``succeeded`` for a replayed member);
2. only if it was written, the batch's counters move (one ``UPDATE ... RETURNING``, which
   holds the batch row's lock until the commit, so the transitions below are decided on
   the counts as they are);
3. the transition that settles the batch writes each callback due as a row of the outbox
   (``job_outbox``, with a task id derived from the batch and the callback), stamping
   ``completed_at``/``succeeded_at``/``failed_at`` under the same lock. The relay publishes
   committed rows; a crash before the commit takes the outcome, the counts and the
   callbacks back together (the member then runs or dies again and is counted then).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from typing import Any

import sqlalchemy as sa

from jobs_platform import db
from jobs_platform.batches.model import batches, members
from jobs_platform.clock import utcnow
from jobs_platform.db import insert_ignoring
from jobs_platform.outbox.model import job_outbox

B = batches.c
M = members.c
SETTLED = ("succeeded", "dead", "cancelled")
CALLBACKS = ("on_complete", "on_success", "on_failure")
_NAMESPACE = uuid.UUID("5d3c4a4e-8a52-4b8e-9a63-6a6f62736261")


@dataclasses.dataclass(frozen=True)
class Change:
    """What one recording did: the outcome moved from ``before`` to ``after``; the counts
    after it; the callbacks it enqueued."""

    before: str
    after: str
    pending: int
    succeeded: int
    dead: int
    cancelled: int
    enqueued: tuple[str, ...]


def callback_task_id(batch_id: str, callback: str) -> str:
    """The task id of a batch's callback: one per (batch, callback), so even a second
    enqueue would be the outbox row already there."""
    return str(uuid.uuid5(_NAMESPACE, f"{batch_id}:{callback}"))


def record(
    conn: sa.Connection,
    batch_id: str,
    member_id: str,
    outcome: str,
    *,
    task_name: str = "",
    dead_letter_id: int | None = None,
    now: dt.datetime | None = None,
) -> Change | None:
    """Record ``member_id``'s ``outcome`` (succeeded, dead or cancelled) in ``conn``'s
    transaction; the change, or ``None`` when it was already counted (or the batch is gone)."""
    if outcome not in SETTLED:
        raise ValueError(f"a member settles as one of {SETTLED}, not {outcome!r}")
    now = now or utcnow()
    lock_batch(conn, batch_id)
    values = {"outcome": outcome, "dead_letter_id": dead_letter_id, "updated_at": now}
    before = _write_outcome(conn, batch_id, member_id, outcome, task_name, values)
    if before is None:
        return None
    moved = {outcome: B[outcome] + 1, before: B[before] - 1}
    counts = conn.execute(
        sa.update(batches)
        .where(B.id == batch_id)
        .values(moved)
        .returning(
            B.pending, B.succeeded, B.dead, B.cancelled, B.completed_at, B.succeeded_at, B.failed_at
        )
    ).first()
    if counts is None:
        # The batch was pruned (a late duplicate, or a dead member replayed after retention):
        # nothing to count it in, so the member row written above goes too.
        conn.execute(sa.delete(members).where(M.batch_id == batch_id, M.member_id == member_id))
        return None
    pending, succeeded, dead, cancelled, completed_at, succeeded_at, failed_at = counts
    due = []
    if outcome == "dead" and failed_at is None:
        due.append("on_failure")
    if pending == 0 and completed_at is None:
        due.append("on_complete")
    if pending == 0 and dead == 0 and cancelled == 0 and succeeded_at is None:
        due.append("on_success")
    enqueued = enqueue_callbacks(conn, batch_id, due, now) if due else ()
    return Change(before, outcome, pending, succeeded, dead, cancelled, enqueued)


_LOCK = sa.select(B.id).where(B.id == sa.bindparam("batch_id")).with_for_update()


def lock_batch(conn: sa.Connection, batch_id: str) -> None:
    """Lock the batch row first (PostgreSQL): every writer of a batch's rows takes the batch
    row, then member rows, as :func:`record_plain` does, so that no two wait on each other.
    (SQLite serialises writers on the database; a read there before the first write would
    only risk a busy snapshot.)"""
    if conn.dialect.name == "postgresql":
        conn.execute(_LOCK, {"batch_id": batch_id})


def _plain_statement(outcome: str) -> sa.TextClause:
    # The batch row is locked first (FOR UPDATE re-reads it as committed): only while more
    # than this member is pending, and (for a death) after the first death was recorded,
    # can this recording settle nothing. The member row is inserted from that lock's row,
    # and the counters move only for a row inserted.
    first_death = " AND failed_at IS NOT NULL" if outcome == "dead" else ""
    return sa.text(
        f"""
        WITH b AS (
            SELECT id FROM job_batches WHERE id = :batch_id AND pending > 1{first_death}
            FOR UPDATE
        ), ins AS (
            INSERT INTO job_batch_members
                (batch_id, member_id, outcome, task_name, dead_letter_id, updated_at)
            SELECT b.id, CAST(:member_id AS VARCHAR), '{outcome}', CAST(:task_name AS VARCHAR),
                CAST(:dead_letter_id AS BIGINT), CAST(:now AS TIMESTAMP WITH TIME ZONE)
            FROM b
            ON CONFLICT (batch_id, member_id) DO NOTHING
            RETURNING batch_id
        )
        UPDATE job_batches SET pending = pending - 1, {outcome} = {outcome} + 1
        WHERE id IN (SELECT batch_id FROM ins)
        RETURNING pending, succeeded, dead, cancelled
        """
    )


#: One statement per outcome, built once; its SQL text per dialect, compiled once.
_PLAIN = {outcome: _plain_statement(outcome) for outcome in SETTLED}
_PLAIN_SQL: dict[tuple[str, str], str] = {}


def _plain_sql(dialect: sa.Dialect, outcome: str) -> str:
    key = (dialect.name, outcome)
    sql = _PLAIN_SQL.get(key)
    if sql is None:
        sql = _PLAIN_SQL[key] = str(_PLAIN[outcome].compile(dialect=dialect))
    return sql


def record_plain(
    conn: sa.Connection,
    batch_id: str,
    member_id: str,
    outcome: str,
    *,
    task_name: str = "",
    dead_letter_id: int | None = None,
    now: dt.datetime | None = None,
) -> Change | None:
    """The common recording in one statement (PostgreSQL): a member recorded for the first
    time that settles nothing (no callback due). It is atomic on its own: ``conn`` must be
    in autocommit. ``None`` when it did not apply (not PostgreSQL; the member has a row
    already: a duplicate, an added member, a replay; the batch would settle or see its first
    death; the batch is gone): nothing was written, and :func:`record` decides.

    Run on the driver's cursor (the SQL compiled once): SQLAlchemy's execution layer cost
    more CPU than the statement itself. A driver error is raised as the driver's."""
    if conn.dialect.name != "postgresql":
        return None
    if outcome not in SETTLED:
        raise ValueError(f"a member settles as one of {SETTLED}, not {outcome!r}")
    params = {
        "batch_id": batch_id,
        "member_id": member_id,
        "task_name": task_name,
        "dead_letter_id": dead_letter_id,
        "now": now or utcnow(),
    }
    dbapi_conn: Any = conn.connection.dbapi_connection
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(_plain_sql(conn.dialect, outcome), params)
        counts = cursor.fetchone()
    finally:
        cursor.close()
    if counts is None:
        return None
    pending, succeeded, dead, cancelled = counts
    return Change("pending", outcome, pending, succeeded, dead, cancelled, ())


def record_alone(
    url: str, batch_id: str, member_id: str, outcome: str, *, task_name: str = ""
) -> Change | None:
    """Record in a transaction of its own (the worker's), on the database at ``url``:
    :func:`record_plain` when it applies (PostgreSQL: one statement, autocommit, no ping),
    else :func:`record` in a transaction."""
    if url.startswith("postgresql"):
        for attempt in (1, 2):
            with db.statement_engine_for(url).connect() as conn:
                try:
                    change = record_plain(conn, batch_id, member_id, outcome, task_name=task_name)
                    break
                except Exception:
                    # Say a pooled connection that died since its last use (no ping): drop
                    # it and run once more on a new one. Safe even if the first run
                    # committed: the member's row is there, and nothing counts twice.
                    conn.invalidate()
                    if attempt == 2:
                        raise
        if change is not None:
            return change
    with db.engine_for(url).begin() as conn:
        return record(conn, batch_id, member_id, outcome, task_name=task_name)


def _write_outcome(
    conn: sa.Connection,
    batch_id: str,
    member_id: str,
    outcome: str,
    task_name: str,
    values: dict[str, Any],
) -> str | None:
    """The outcome the member had before (``pending`` for one never recorded), or ``None``
    when this recording changes nothing."""
    key = (M.batch_id == batch_id, M.member_id == member_id)
    row = {"batch_id": batch_id, "member_id": member_id, "task_name": task_name, **values}
    inserted = conn.execute(
        insert_ignoring(conn, members, row, unique=["batch_id", "member_id"]).returning(M.outcome)
    ).first()
    if inserted is not None:
        return "pending"
    for before in ("pending", "dead") if outcome == "succeeded" else ("pending",):
        # Conditional: of two racing recordings one moves the row, the other finds it moved.
        if conn.execute(
            sa.update(members).where(*key, M.outcome == before).values(values)
        ).rowcount:
            return before
    return None


_STAMPS = {"on_complete": "completed_at", "on_success": "succeeded_at", "on_failure": "failed_at"}


def enqueue_callbacks(
    conn: sa.Connection, batch_id: str, due: list[str], now: dt.datetime
) -> tuple[str, ...]:
    """Stamp each of ``due`` and write its outbox row (if the batch has that callback); the
    callbacks enqueued. Called with the batch row locked by this transaction."""
    done = []
    callbacks: dict[str, Any] | None = None
    for name in due:
        stamp = B[_STAMPS[name]]
        if not conn.execute(
            sa.update(batches).where(B.id == batch_id, stamp.is_(None)).values({stamp: now})
        ).rowcount:
            continue
        if callbacks is None:
            text = conn.execute(sa.select(B.callbacks).where(B.id == batch_id)).scalar()
            callbacks = json.loads(text or "{}")
        callback = callbacks.get(name)
        if not callback:
            continue
        conn.execute(
            insert_ignoring(
                conn,
                job_outbox,
                {
                    "task_id": callback_task_id(batch_id, name),
                    "task_name": callback["task"],
                    "payload": callback["payload"],
                    "options": callback["options"],
                    "created_at": now,
                },
                unique=["task_id"],
            )
        )
        done.append(name)
    return tuple(done)


def create(
    conn: sa.Connection,
    batch_id: str,
    name: str,
    total: int,
    callbacks: dict[str, Any],
    now: dt.datetime | None = None,
) -> tuple[str, ...]:
    """Insert the batch row; an empty batch settles (and enqueues its callbacks) at once."""
    now = now or utcnow()
    conn.execute(
        sa.insert(batches).values(
            id=batch_id,
            name=name,
            total=total,
            pending=total,
            succeeded=0,
            dead=0,
            cancelled=0,
            callbacks=json.dumps(callbacks),
            created_at=now,
        )
    )
    if total:
        return ()
    return enqueue_callbacks(conn, batch_id, ["on_complete", "on_success"], now)


def add_members(
    conn: sa.Connection, batch_id: str, added: list[tuple[str, str]], now: dt.datetime | None = None
) -> int:
    """Add ``(member_id, task_name)`` pending members; how many were new (a re-run of the
    adding member adds the same ids, which count once)."""
    now = now or utcnow()
    lock_batch(conn, batch_id)
    new = 0
    for member_id, task_name in added:
        row = {
            "batch_id": batch_id,
            "member_id": member_id,
            "outcome": "pending",
            "task_name": task_name,
            "updated_at": now,
        }
        stmt = insert_ignoring(conn, members, row, unique=["batch_id", "member_id"])
        if conn.execute(stmt.returning(M.member_id)).first() is not None:
            new += 1
    if new:
        conn.execute(
            sa.update(batches)
            .where(B.id == batch_id)
            .values(total=B.total + new, pending=B.pending + new)
        )
    return new


def cancel(conn: sa.Connection, batch_id: str, reason: str, now: dt.datetime | None = None) -> bool:
    """Mark the batch cancelled; whether this call did (a second cancel keeps the first)."""
    moved = conn.execute(
        sa.update(batches)
        .where(B.id == batch_id, B.cancelled_at.is_(None))
        .values(cancelled_at=now or utcnow(), cancel_reason=reason)
    ).rowcount
    return bool(moved)


def is_cancelled(conn: sa.Connection, batch_id: str) -> bool:
    return conn.execute(sa.select(B.cancelled_at).where(B.id == batch_id)).scalar() is not None
