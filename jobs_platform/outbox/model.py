"""The outbox table (created by migration 0005): one row per job dispatched on commit."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from jobs_platform.db import Base


class OutboxJob(Base):
    """A job written in the producer's transaction, published by a worker's relay.

    ``payload`` is the JSON of ``[args, kwargs]`` exactly as ``.delay()`` would have sent
    it (kombu's JSON, so a datetime or a Decimal arrives as itself); ``options`` is the
    checked message options (queue, priority, an absolute eta, headers, time limits) in
    the same JSON. ``published_at`` is set in the relay's transaction once the broker
    took the message; a published row is kept ``JOBS_OUTBOX_RETENTION`` for inspection.
    """

    __tablename__ = "job_outbox"
    __table_args__ = (
        # The relay's claim and the depth metric read only unpublished rows, oldest first.
        sa.Index(
            "ix_job_outbox_pending",
            "id",
            postgresql_where=sa.text("published_at IS NULL"),
            sqlite_where=sa.text("published_at IS NULL"),
        ),
        sa.Index("ix_job_outbox_published_at", "published_at"),
    )

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True
    )
    task_id: Mapped[str] = mapped_column(sa.String(255), unique=True)
    task_name: Mapped[str] = mapped_column(sa.String(255))
    payload: Mapped[str] = mapped_column(sa.Text)
    options: Mapped[str] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
    published_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))


job_outbox: sa.Table = OutboxJob.__table__  # type: ignore[assignment]
