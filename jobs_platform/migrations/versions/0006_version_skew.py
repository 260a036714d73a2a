"""dead_letter_jobs.reason may be ``version_skew`` (a payload that does not fit the code).

The CHECK constraint only widens: every stored row still satisfies it. SQLite cannot alter a
constraint, so the table is copied (Alembic's batch mode); its count triggers go with the
old table and are created again from their stored SQL.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLE = "dead_letter_jobs"
# The name 0001 gave it (the naming convention prefixed the name it was given).
NAME = "ck_dead_letter_jobs_ck_dead_letter_jobs_reason"
BEFORE = ("exhausted", "permanent", "time_limit", "worker_lost", "poison", "expired", "rejected")
AFTER = (*BEFORE, "version_skew")


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
    # Rows of the new reason would break the old constraint: they keep their job as permanent.
    op.execute(sa.text(f"UPDATE {TABLE} SET reason = 'permanent' WHERE reason = 'version_skew'"))
    _replace_check(BEFORE)
