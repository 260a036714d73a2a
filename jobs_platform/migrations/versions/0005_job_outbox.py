"""job_outbox: jobs dispatched in a database transaction, published by the workers' relay.

Revision ID: 0005
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0003"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)
PENDING = sa.text("published_at IS NULL")


def upgrade() -> None:
    op.create_table(
        "job_outbox",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(255), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("published_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_outbox"),
        sa.UniqueConstraint("task_id", name="uq_job_outbox_task_id"),
    )
    op.create_index(
        "ix_job_outbox_pending",
        "job_outbox",
        ["id"],
        postgresql_where=PENDING,
        sqlite_where=PENDING,
    )
    op.create_index("ix_job_outbox_published_at", "job_outbox", ["published_at"])


def downgrade() -> None:
    op.drop_index("ix_job_outbox_published_at", table_name="job_outbox")
    op.drop_index("ix_job_outbox_pending", table_name="job_outbox")
    op.drop_table("job_outbox")
