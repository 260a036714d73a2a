"""The batch tables (created by migration 0007): one row per batch, one per settled member."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from jobs_platform.db import Base

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)

#: A member's outcome: ``pending`` (added by a running member, not settled yet), then one of
#: the settled ones. A replayed dead member moves ``dead -> succeeded``; nothing else moves.
OUTCOMES: tuple[str, ...] = ("pending", "succeeded", "dead", "cancelled")


class Batch(Base):
    """A batch: its counters (``pending + succeeded + dead + cancelled == total``), its
    callbacks as outbox rows to write, and when each callback was enqueued.

    ``completed_at``/``succeeded_at``/``failed_at`` are set by the transaction that enqueued
    ``on_complete``/``on_success``/``on_failure`` (each once: the update is conditional on
    the stamp being NULL, under the row's lock).
    """

    __tablename__ = "job_batches"
    __table_args__ = (
        # Metrics and `batch list` read the open ones; retention the old settled ones.
        sa.Index("ix_job_batches_completed_at", "completed_at"),
    )

    id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(255))
    total: Mapped[int] = mapped_column(BigId, default=0)
    pending: Mapped[int] = mapped_column(BigId, default=0)
    succeeded: Mapped[int] = mapped_column(BigId, default=0)
    dead: Mapped[int] = mapped_column(BigId, default=0)
    cancelled: Mapped[int] = mapped_column(BigId, default=0)
    #: JSON: {"on_complete": {"task": ..., "payload": ..., "options": ...}, ...}.
    callbacks: Mapped[str] = mapped_column(sa.Text, default="{}")
    created_at: Mapped[dt.datetime] = mapped_column(TS)
    completed_at: Mapped[dt.datetime | None] = mapped_column(TS)
    succeeded_at: Mapped[dt.datetime | None] = mapped_column(TS)
    failed_at: Mapped[dt.datetime | None] = mapped_column(TS)
    cancelled_at: Mapped[dt.datetime | None] = mapped_column(TS)
    cancel_reason: Mapped[str | None] = mapped_column(sa.Text)


class Member(Base):
    """A member's outcome, once: the primary key (batch, member) is the UNIQUE constraint
    that makes a redelivered or twice-run member count once. ``member_id`` is the task id the
    member was dispatched with (a replay carries it in a header)."""

    __tablename__ = "job_batch_members"
    __table_args__ = (
        sa.CheckConstraint(
            "outcome IN ({})".format(", ".join(repr(o) for o in OUTCOMES)), name="outcome"
        ),
    )

    batch_id: Mapped[str] = mapped_column(sa.String(36), primary_key=True)
    member_id: Mapped[str] = mapped_column(sa.String(255), primary_key=True)
    outcome: Mapped[str] = mapped_column(sa.String(16))
    task_name: Mapped[str] = mapped_column(sa.String(255), default="")
    dead_letter_id: Mapped[int | None] = mapped_column(BigId)
    updated_at: Mapped[dt.datetime] = mapped_column(TS)


batches: sa.Table = Batch.__table__  # type: ignore[assignment]
members: sa.Table = Member.__table__  # type: ignore[assignment]
