"""The ``dead_letter_jobs`` table: one row per job that will not run again by itself.

A row keeps what a person needs to understand the failure (the ordered error history, the
final traceback, a fingerprint for grouping) and what a replay needs to send the job again
exactly as it was sent (JSON args/kwargs, headers, queue, priority, routing). Poison
messages, which never became a task, keep their raw body instead.

``dedupe_key`` is UNIQUE: the capture path may deliver the same dead letter more than once
(Celery fires ``task_failure`` twice on a hard time limit; the spool drainer and the
failure path may race), and insert-or-ignore on this key makes every write idempotent.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Mapped, mapped_column

from jobs_platform.db import Base

TABLE = "dead_letter_jobs"

#: Why a job is dead (closed set; checked by the database).
REASONS: tuple[str, ...] = (
    "exhausted",
    "permanent",
    "time_limit",
    "worker_lost",
    "poison",
    "expired",
    "rejected",
    "version_skew",
    "upstream_failed",
)
#: Where a row is in its life: ``dead`` until a person replays or discards it.
STATUSES: tuple[str, ...] = ("dead", "replayed", "discarded")

#: JSON on SQLite, JSONB on PostgreSQL.
JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
#: SQLite only auto-increments an INTEGER PRIMARY KEY.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
UtcDateTime = sa.DateTime(timezone=True)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class DeadLetterJob(Base):
    __tablename__ = TABLE
    __table_args__ = (
        sa.CheckConstraint(_in("reason", REASONS), name="reason"),
        sa.CheckConstraint(_in("status", STATUSES), name="status"),
        # The listing: newest first, optionally by status.
        sa.Index("ix_dead_letter_jobs_status_failed_at", "status", "failed_at"),
        sa.Index("ix_dead_letter_jobs_failed_at", "failed_at"),
        # Filters and grouping.
        sa.Index("ix_dead_letter_jobs_task_name_failed_at", "task_name", "failed_at"),
        # A group's rows (dead_letter_counts' key), newest last: stats over a time window,
        # and the triggers finding a group's newest row when one leaves.
        sa.Index(
            "ix_dead_letter_jobs_group",
            "status",
            "task_name",
            "fingerprint",
            "queue",
            "reason",
            "id",
        ),
        sa.Index("ix_dead_letter_jobs_fingerprint", "fingerprint"),
        sa.Index("ix_dead_letter_jobs_task_id", "task_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    dedupe_key: Mapped[str] = mapped_column(sa.String(64), unique=True)
    task_id: Mapped[str | None] = mapped_column(sa.String(255))
    task_name: Mapped[str] = mapped_column(sa.String(255), default="")
    queue: Mapped[str] = mapped_column(sa.String(255), default="")
    # -- what a replay needs ----------------------------------------------------------------
    args: Mapped[Any] = mapped_column(JSONType, nullable=True)
    kwargs: Mapped[Any] = mapped_column(JSONType, nullable=True)
    headers: Mapped[Any] = mapped_column(JSONType, nullable=True)
    priority: Mapped[int | None] = mapped_column(sa.Integer)
    exchange: Mapped[str | None] = mapped_column(sa.String(255))
    routing_key: Mapped[str | None] = mapped_column(sa.String(255))
    redacted: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    # -- poison messages: the message as it arrived ---------------------------------------
    raw_body: Mapped[str | None] = mapped_column(sa.Text)
    raw_body_encoding: Mapped[str | None] = mapped_column(sa.String(16))  # utf-8 | base64
    content_type: Mapped[str | None] = mapped_column(sa.String(255))
    content_encoding: Mapped[str | None] = mapped_column(sa.String(64))
    # -- why it died --------------------------------------------------------------------
    reason: Mapped[str] = mapped_column(sa.String(16))
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0)
    errors: Mapped[Any] = mapped_column(JSONType)  # [{type, message, at, attempt, status?}]
    error_type: Mapped[str] = mapped_column(sa.String(255), default="")
    error_message: Mapped[str] = mapped_column(sa.Text, default="")
    traceback: Mapped[str | None] = mapped_column(sa.Text)
    fingerprint: Mapped[str] = mapped_column(sa.String(16))
    worker: Mapped[str | None] = mapped_column(sa.String(255))
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    failed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime)
    # -- what a person did about it ---------------------------------------------------------
    status: Mapped[str] = mapped_column(sa.String(16), default="dead")
    resolution_reason: Mapped[str | None] = mapped_column(sa.Text)
    resolved_by: Mapped[str | None] = mapped_column(sa.String(255))
    resolved_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    # -- lineage ------------------------------------------------------------------------
    replayed_task_id: Mapped[str | None] = mapped_column(sa.String(255))
    replay_of: Mapped[int | None] = mapped_column(
        BigId, sa.ForeignKey(f"{TABLE}.id", ondelete="SET NULL")
    )


COUNTS_TABLE = "dead_letter_counts"
#: What ``dlq stats`` groups by, and the key of :class:`DeadLetterCount`.
GROUP = ("status", "task_name", "queue", "reason", "fingerprint")


class DeadLetterCount(Base):
    """How many rows of ``dead_letter_jobs`` share one group, kept with every write.

    ``dlq stats`` over a million rows is a GROUP BY over a million rows (0.5 s on either
    database), whatever the index; this table has a row per group (tasks x causes x status),
    so the same answer is a scan of a few hundred rows. Triggers change it in the
    transaction that changes the rows it counts, so it is exact whoever writes
    (:mod:`jobs_platform.deadletter.counts`); ``dlq recount`` rebuilds it from the rows.
    """

    __tablename__ = COUNTS_TABLE

    status: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    task_name: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    queue: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    reason: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(sa.String(16), primary_key=True)
    count: Mapped[int] = mapped_column(sa.BigInteger)
    #: The newest row of the group (its error is the group's sample).
    last_id: Mapped[int | None] = mapped_column(BigId)
