"""The platform's idempotency-key table (created by migration 0002)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Mapped, mapped_column

from jobs_platform.db import Base

CLAIMED = "claimed"
DONE = "done"
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


class IdempotencyKey(Base):
    """One logical side effect: claimed by one attempt, then done with its recorded result."""

    __tablename__ = "idempotency_keys"
    __table_args__ = (sa.CheckConstraint(f"state IN ('{CLAIMED}', '{DONE}')", name="state"),)

    id: Mapped[int] = mapped_column(
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True
    )
    key: Mapped[str] = mapped_column(sa.String(255), unique=True)
    task: Mapped[str] = mapped_column(sa.String(255))
    state: Mapped[str] = mapped_column(sa.String(16))
    owner: Mapped[str | None] = mapped_column(sa.String(200))
    result: Mapped[Any] = mapped_column(JSON, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
    updated_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True))
    #: While ``claimed``: when the claimant's lease runs out and the key may be taken over.
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(sa.DateTime(timezone=True))
    #: When the row may be purged; after it, the key counts as never seen.
    expires_at: Mapped[dt.datetime] = mapped_column(sa.DateTime(timezone=True), index=True)


idempotency_keys: sa.Table = IdempotencyKey.__table__  # type: ignore[assignment]
