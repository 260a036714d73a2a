"""dead_letter_jobs.reason may be ``upstream_failed`` (a chain step or chord callback that
never ran because a job before it died).

The CHECK constraint only widens, as in 0006: SQLite copies the table (Alembic's batch mode)
and creates its count triggers again from their stored SQL.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLE = "dead_letter_jobs"
# The name 0001 gave it (the naming convention prefixed the name it was given).
NAME = "ck_dead_letter_jobs_ck_dead_letter_jobs_reason"
BEFORE = (
    "exhausted",
    "permanent",
    "time_limit",
    "worker_lost",
    "poison",
    "expired",
    "rejected",
    "version_skew",
)
AFTER = (*BEFORE, "upstream_failed")


def _in(values: tuple[str, ...]) -> str:
    return f"reason IN ({', '.join(repr(v) for v in values)})"


def _replace_check(values: tuple[str, ...]) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite":
        op.drop_constraint(op.f(NAME), TABLE, type_="check")
        op.create_check_constraint(op.f(NAME), TABLE, _in(values))
        return
    triggers = (
        bind.execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = :t"),
            {"t": TABLE},
        )
        .scalars()
        .all()
    )
    with op.batch_alter_table(TABLE, recreate="always") as batch:
        batch.drop_constraint(op.f(NAME), type_="check")
        batch.create_check_constraint(op.f(NAME), _in(values))
    for sql in triggers:
        op.execute(sql)


def upgrade() -> None:
    _replace_check(AFTER)


def downgrade() -> None:
    # The old constraint refuses the new reason: such rows keep their job as permanent.
    op.execute(sa.text(f"UPDATE {TABLE} SET reason = 'permanent' WHERE reason = 'upstream_failed'"))
    _replace_check(BEFORE)
