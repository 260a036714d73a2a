"""job_batches and job_batch_members: batches with exact counts and once-only callbacks.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BIG = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)
OUTCOMES = ("pending", "succeeded", "dead", "cancelled")


def upgrade() -> None:
    op.create_table(
        "job_batches",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("total", BIG, nullable=False),
        sa.Column("pending", BIG, nullable=False),
        sa.Column("succeeded", BIG, nullable=False),
        sa.Column("dead", BIG, nullable=False),
        sa.Column("cancelled", BIG, nullable=False),
        sa.Column("callbacks", sa.Text(), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("completed_at", TS, nullable=True),
        sa.Column("succeeded_at", TS, nullable=True),
        sa.Column("failed_at", TS, nullable=True),
        sa.Column("cancelled_at", TS, nullable=True),
        sa.Column("cancel_reason", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_job_batches"),
    )
    op.create_index("ix_job_batches_completed_at", "job_batches", ["completed_at"])
    op.create_table(
        "job_batch_members",
        sa.Column("batch_id", sa.String(36), nullable=False),
        sa.Column("member_id", sa.String(255), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("dead_letter_id", BIG, nullable=True),
        sa.Column("updated_at", TS, nullable=False),
        sa.CheckConstraint(
            "outcome IN ({})".format(", ".join(repr(o) for o in OUTCOMES)),
            name="ck_job_batch_members_outcome",
        ),
        sa.PrimaryKeyConstraint("batch_id", "member_id", name="pk_job_batch_members"),
    )


def downgrade() -> None:
    op.drop_table("job_batch_members")
    op.drop_index("ix_job_batches_completed_at", table_name="job_batches")
    op.drop_table("job_batches")
