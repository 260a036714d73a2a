"""``dead_letter_counts``: the group counts behind ``dlq stats``, kept by the database.

Triggers on ``dead_letter_jobs`` (migration 0003: row triggers on SQLite, statement
triggers over the changed rows on PostgreSQL) add and subtract in the transaction of the
write itself. The database does it rather than the store, so that every writer counts: a
worker of the previous release still writing while the new one migrates, a fix made by
hand in SQL, a bulk delete. Only what skips triggers (PostgreSQL's TRUNCATE has its own;
``session_replication_role = replica``) needs :func:`recount`.
"""

from __future__ import annotations

import sqlalchemy as sa

from jobs_platform.deadletter.model import GROUP, DeadLetterCount, DeadLetterJob

COUNTS: sa.Table = DeadLetterCount.__table__  # type: ignore[assignment]
ROWS: sa.Table = DeadLetterJob.__table__  # type: ignore[assignment]


def recount(conn: sa.Connection) -> int:
    """Rebuild every count from the rows, in the caller's transaction; how many groups.

    On PostgreSQL the rows are held against writes until the caller commits (SHARE mode:
    reads go on), so no write falls between the two statements; on SQLite the DELETE
    takes the writer lock that does the same.
    """
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text(f"LOCK TABLE {ROWS.name} IN SHARE MODE"))
    conn.execute(sa.delete(COUNTS))
    columns = [ROWS.c[name] for name in GROUP]
    conn.execute(
        sa.insert(COUNTS).from_select(
            [*GROUP, "count", "last_id"],
            sa.select(*columns, sa.func.count(), sa.func.max(ROWS.c.id)).group_by(*columns),
        )
    )
    return int(conn.execute(sa.select(sa.func.count()).select_from(COUNTS)).scalar_one())
