"""dead_letter_jobs: every terminal failure, with what a replay needs.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

REASONS = ("exhausted", "permanent", "time_limit", "worker_lost", "poison", "expired", "rejected")
STATUSES = ("dead", "replayed", "discarded")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


def upgrade() -> None:
    op.create_table(
        "dead_letter_jobs",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("dedupe_key", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(255), nullable=True),
        sa.Column("task_name", sa.String(255), nullable=False),
        sa.Column("queue", sa.String(255), nullable=False),
        sa.Column("args", JSON, nullable=True),
        sa.Column("kwargs", JSON, nullable=True),
        sa.Column("headers", JSON, nullable=True),
        sa.Column("priority", sa.Integer, nullable=True),
        sa.Column("exchange", sa.String(255), nullable=True),
        sa.Column("routing_key", sa.String(255), nullable=True),
        sa.Column("redacted", sa.Boolean, nullable=False),
        sa.Column("raw_body", sa.Text, nullable=True),
        sa.Column("raw_body_encoding", sa.String(16), nullable=True),
        sa.Column("content_type", sa.String(255), nullable=True),
        sa.Column("content_encoding", sa.String(64), nullable=True),
        sa.Column("reason", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("errors", JSON, nullable=False),
        sa.Column("error_type", sa.String(255), nullable=False),
        sa.Column("error_message", sa.Text, nullable=False),
        sa.Column("traceback", sa.Text, nullable=True),
        sa.Column("fingerprint", sa.String(16), nullable=False),
        sa.Column("worker", sa.String(255), nullable=True),
        sa.Column("enqueued_at", TS, nullable=True),
        sa.Column("failed_at", TS, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("resolution_reason", sa.Text, nullable=True),
        sa.Column("resolved_by", sa.String(255), nullable=True),
        sa.Column("resolved_at", TS, nullable=True),
        sa.Column("replayed_task_id", sa.String(255), nullable=True),
        sa.Column("replay_of", BIG_ID, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_dead_letter_jobs"),
        sa.UniqueConstraint("dedupe_key", name="uq_dead_letter_jobs_dedupe_key"),
        sa.CheckConstraint(_in("reason", REASONS), name="ck_dead_letter_jobs_reason"),
        sa.CheckConstraint(_in("status", STATUSES), name="ck_dead_letter_jobs_status"),
        sa.ForeignKeyConstraint(
            ["replay_of"],
            ["dead_letter_jobs.id"],
            ondelete="SET NULL",
            name="fk_dead_letter_jobs_replay_of_dead_letter_jobs",
        ),
    )
    op.create_index(
        "ix_dead_letter_jobs_status_failed_at", "dead_letter_jobs", ["status", "failed_at"]
    )
    op.create_index("ix_dead_letter_jobs_failed_at", "dead_letter_jobs", ["failed_at"])
    op.create_index(
        "ix_dead_letter_jobs_task_name_failed_at", "dead_letter_jobs", ["task_name", "failed_at"]
    )
    op.create_index(
        "ix_dead_letter_jobs_status_task_name_fingerprint",
        "dead_letter_jobs",
        ["status", "task_name", "fingerprint", "id"],
    )
    op.create_index("ix_dead_letter_jobs_fingerprint", "dead_letter_jobs", ["fingerprint"])
    op.create_index("ix_dead_letter_jobs_task_id", "dead_letter_jobs", ["task_id"])


def downgrade() -> None:
    op.drop_table("dead_letter_jobs")
