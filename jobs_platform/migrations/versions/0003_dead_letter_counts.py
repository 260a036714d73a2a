"""dead_letter_counts: the group counts ``dlq stats`` reads, kept by triggers.

The triggers add and subtract in the transaction of the write, so every writer counts,
including a worker of the previous release still writing while this runs. A group's
newest row (``last_id``, its error is the group's sample) is looked up again through
``ix_dead_letter_jobs_group`` when rows leave the group.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
GROUP = ("status", "task_name", "queue", "reason", "fingerprint")
COLUMNS = ", ".join(GROUP)


def _same(a: str, b: str) -> str:
    return " AND ".join(f"{a}.{c} = {b}.{c}" for c in GROUP)


def _changed(a: str, b: str) -> str:
    return " OR ".join(f"{a}.{c} IS NOT {b}.{c}" for c in GROUP)


# -- PostgreSQL: once per statement, over the rows it changed -------------------------------
PG_ADD = f"""
    INSERT INTO dead_letter_counts AS c ({COLUMNS}, count, last_id)
    SELECT {COLUMNS}, count(*), max(id) FROM new_rows
    GROUP BY {COLUMNS} ORDER BY {COLUMNS}
    ON CONFLICT ({COLUMNS}) DO UPDATE
    SET count = c.count + excluded.count, last_id = greatest(c.last_id, excluded.last_id);
"""
# The groups are locked in key order first, so two bulk writes never wait crosswise.
PG_TAKE = f"""
    PERFORM 1 FROM dead_letter_counts c
    WHERE ({COLUMNS}) IN (SELECT {COLUMNS} FROM old_rows)
    ORDER BY {COLUMNS} FOR UPDATE;
    UPDATE dead_letter_counts c
    SET count = c.count - o.n,
        last_id = (SELECT max(j.id) FROM dead_letter_jobs j WHERE {_same("j", "c")})
    FROM (SELECT {COLUMNS}, count(*) AS n FROM old_rows GROUP BY {COLUMNS}) o
    WHERE {_same("c", "o")};
    DELETE FROM dead_letter_counts c
    WHERE c.count <= 0 AND ({COLUMNS}) IN (SELECT {COLUMNS} FROM old_rows);
"""
PG_FUNCTIONS = {
    "inserted": PG_ADD,
    "updated": PG_ADD + PG_TAKE,
    "deleted": PG_TAKE,
    "truncated": "DELETE FROM dead_letter_counts;",
}
PG_TRIGGERS = {
    "inserted": "AFTER INSERT ON dead_letter_jobs REFERENCING NEW TABLE AS new_rows",
    "updated": "AFTER UPDATE ON dead_letter_jobs "
    "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows",
    "deleted": "AFTER DELETE ON dead_letter_jobs REFERENCING OLD TABLE AS old_rows",
    "truncated": "AFTER TRUNCATE ON dead_letter_jobs",
}

# -- SQLite: once per row -----------------------------------------------------------------
SQLITE_ADD = f"""
    INSERT INTO dead_letter_counts ({COLUMNS}, count, last_id)
    VALUES ({", ".join(f"NEW.{c}" for c in GROUP)}, 1, NEW.id)
    ON CONFLICT ({COLUMNS}) DO UPDATE
    SET count = count + 1, last_id = max(coalesce(last_id, 0), excluded.last_id);
"""
SQLITE_TAKE = f"""
    UPDATE dead_letter_counts
    SET count = count - 1,
        last_id = (SELECT max(j.id) FROM dead_letter_jobs j WHERE {_same("j", "OLD")})
    WHERE {" AND ".join(f"{c} = OLD.{c}" for c in GROUP)};
    DELETE FROM dead_letter_counts
    WHERE count <= 0 AND {" AND ".join(f"{c} = OLD.{c}" for c in GROUP)};
"""
SQLITE_TRIGGERS = {
    "inserted": ("AFTER INSERT ON dead_letter_jobs", SQLITE_ADD),
    "updated": (
        f"AFTER UPDATE OF {COLUMNS} ON dead_letter_jobs WHEN {_changed('OLD', 'NEW')}",
        SQLITE_ADD + SQLITE_TAKE,
    ),
    "deleted": ("AFTER DELETE ON dead_letter_jobs", SQLITE_TAKE),
}


def upgrade() -> None:
    op.drop_index("ix_dead_letter_jobs_status_task_name_fingerprint", table_name="dead_letter_jobs")
    op.create_index(
        "ix_dead_letter_jobs_group",
        "dead_letter_jobs",
        ["status", "task_name", "fingerprint", "queue", "reason", "id"],
    )
    op.create_table(
        "dead_letter_counts",
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("fingerprint", sa.String(16), nullable=False),
        sa.Column("count", sa.BigInteger, nullable=False),
        sa.Column("last_id", BIG_ID, nullable=True),
        sa.PrimaryKeyConstraint(*GROUP, name="pk_dead_letter_counts"),
    )
    if op.get_bind().dialect.name == "postgresql":
        # Writers of the previous release are held until this commits: the triggers and
        # the first counts appear together, and no row falls between them.
        op.execute("LOCK TABLE dead_letter_jobs IN SHARE ROW EXCLUSIVE MODE")
        for name, body in PG_FUNCTIONS.items():
            op.execute(
                f"CREATE FUNCTION dead_letter_counts_{name}() RETURNS trigger "
                f"LANGUAGE plpgsql AS $$ BEGIN {body} RETURN NULL; END $$"
            )
            op.execute(
                f"CREATE TRIGGER dead_letter_counts_{name} {PG_TRIGGERS[name]} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION dead_letter_counts_{name}()"
            )
    else:
        for name, (when, body) in SQLITE_TRIGGERS.items():
            op.execute(f"CREATE TRIGGER dead_letter_counts_{name} {when} BEGIN {body} END")
    op.execute(
        f"INSERT INTO dead_letter_counts ({COLUMNS}, count, last_id) "
        f"SELECT {COLUMNS}, count(*), max(id) FROM dead_letter_jobs GROUP BY {COLUMNS}"
    )


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for name in PG_FUNCTIONS if postgresql else SQLITE_TRIGGERS:
        on = " ON dead_letter_jobs" if postgresql else ""
        op.execute(f"DROP TRIGGER dead_letter_counts_{name}{on}")
        if postgresql:
            op.execute(f"DROP FUNCTION dead_letter_counts_{name}()")
    op.drop_table("dead_letter_counts")
    op.create_index(
        "ix_dead_letter_jobs_status_task_name_fingerprint",
        "dead_letter_jobs",
        ["status", "task_name", "fingerprint", "id"],
    )
    op.drop_index("ix_dead_letter_jobs_group", table_name="dead_letter_jobs")
