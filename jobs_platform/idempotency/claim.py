"""Leased claims: the one primitive under the status CAS and the idempotency-key table.

An attempt *claims* a row before its side effect: the row's state becomes ``held``, its
owner column names the attempt and its expiry column says until when. Who may claim:

* anyone, while the row is *free* (the caller says what free means: a status in
  ``from_`` for :mod:`.cas`, a row past its TTL for :mod:`.keys`);
* anyone, once the holder's lease ran out (or it has none): the holder is certainly gone;
* a later attempt of the holder's own job at once (``same_job``, see :func:`same_job_prefix`).

Each step is one conditional statement, so the database arbitrates: PostgreSQL re-checks
the ``WHERE`` of a blocked ``UPDATE`` against the committed row and SQLite serialises
writers, so of two racing attempts exactly one changes the row ::

    take:   UPDATE t SET state=:held, owner=:owner, expires=:lease, ...
             WHERE id=:id AND (<free> OR (state=:held AND (expires IS NULL OR expires < :now
                                                           OR owner LIKE :same_job || '%')))
    insert: INSERT ... ON CONFLICT (id) DO NOTHING              (a row that does not exist yet)
    settle: UPDATE t SET ... WHERE id=:id AND state=:held AND owner=:owner    (finish, release)
    drop:   DELETE FROM t    WHERE id=:id AND state=:held AND owner=:owner

Owners are unique per attempt (so two deliveries of one message are told apart). The
default lease is the task's hard time limit: past it the worker has killed the attempt;
and since every hard limit sits below the visibility timeout minus its margin (an
invariant checked at declaration), a message redelivered after a crash always finds the
crashed attempt's lease expired. Leases are compared with the workers' clocks (UTC), so
those clocks must agree to well within a lease (NTP).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

import sqlalchemy as sa

from jobs_platform.db import insert_ignoring
from jobs_platform.errors import ConfigError

Clock: TypeAlias = Callable[[], dt.datetime]


class Claim:
    """A claim this process holds on one row (the owner token proves it)."""

    __slots__ = ("expires_at", "owner", "row_id")

    def __init__(self, row_id: Any, owner: str, expires_at: dt.datetime) -> None:
        self.row_id = row_id
        self.owner = owner
        self.expires_at = expires_at

    def __repr__(self) -> str:
        return f"Claim(row_id={self.row_id!r}, owner={self.owner!r})"


class LeasedClaims:
    """Claims on the rows of ``table``: held while ``state`` is ``held``, by ``owner``,
    until ``expires``. Every method runs on the caller's connection (its transaction)."""

    def __init__(
        self,
        table: sa.Table,
        *,
        held: str,
        id_column: str,
        state_column: str,
        owner_column: str,
        expires_column: str,
    ) -> None:
        self.table = table
        self.held = held
        self.id = table.c[id_column]
        self.state = table.c[state_column]
        self.owner = table.c[owner_column]
        self.expires = table.c[expires_column]

    def take(
        self,
        conn: sa.Connection,
        row_id: Any,
        *,
        free: sa.ColumnElement[bool],
        owner: str,
        lease_s: float,
        now: dt.datetime,
        same_job: str | None = None,
        values: Mapping[str, Any] | None = None,
    ) -> Claim | None:
        """Claim the existing row if it is ``free`` or its holder is gone; ``values`` are
        written with the claim. None: the row is missing, or held by a live claimant, or
        neither free nor held (a done state)."""
        expires_at = now + dt.timedelta(seconds=lease_s)
        stmt = (
            sa.update(self.table)
            .where(self.id == row_id, sa.or_(free, self._holder_gone(now, same_job)))
            .values(self._claimed(values, owner, expires_at))
        )
        if conn.execute(stmt).rowcount == 1:
            return Claim(row_id, owner, expires_at)
        return None

    def insert(
        self,
        conn: sa.Connection,
        row_id: Any,
        *,
        owner: str,
        lease_s: float,
        now: dt.datetime,
        values: Mapping[str, Any],
    ) -> Claim | None:
        """Create the row already claimed; None if it exists (the UNIQUE ``id`` decides)."""
        expires_at = now + dt.timedelta(seconds=lease_s)
        row = {**self._claimed(values, owner, expires_at), self.id.name: row_id}
        stmt = insert_ignoring(conn, self.table, row, unique=[self.id.name])
        # RETURNING, not rowcount: with RETURNING (which SQLAlchemy adds for a generated
        # primary key) the driver reports no rowcount; an ignored duplicate returns no row.
        if conn.execute(stmt.returning(self.id)).first() is None:
            return None
        return Claim(row_id, owner, expires_at)

    def settle(
        self, conn: sa.Connection, row_id: Any, owner: str | None, values: Mapping[str, Any]
    ) -> bool:
        """Write ``values`` (the done state, a release...) if ``owner`` still holds the row."""
        stmt = sa.update(self.table).where(self._held_by(row_id, owner)).values(dict(values))
        return bool(conn.execute(stmt).rowcount == 1)

    def drop(self, conn: sa.Connection, row_id: Any, owner: str | None) -> bool:
        """Delete the row if ``owner`` still holds it."""
        stmt = sa.delete(self.table).where(self._held_by(row_id, owner))
        return bool(conn.execute(stmt).rowcount == 1)

    def _claimed(
        self, values: Mapping[str, Any] | None, owner: str, expires_at: dt.datetime
    ) -> dict[str, Any]:
        return {
            **(values or {}),
            self.state.name: self.held,
            self.owner.name: owner,
            self.expires.name: expires_at,
        }

    def _holder_gone(self, now: dt.datetime, same_job: str | None) -> sa.ColumnElement[bool]:
        gone = [self.expires.is_(None), self.expires < now]  # a crashed claimant's lease ran out
        if same_job is not None:
            gone.append(self.owner.startswith(same_job, autoescape=True))
        return sa.and_(self.state == self.held, sa.or_(*gone))

    def _held_by(self, row_id: Any, owner: str | None) -> sa.ColumnElement[bool]:
        return sa.and_(self.id == row_id, self.state == self.held, self.owner == owner)


def current_task() -> Any:
    """The Celery task running in this thread, or ``None`` outside a worker."""
    from celery import current_task as proxy

    task = proxy._get_current_object()
    if task is None or getattr(task.request, "called_directly", True):
        return None
    return task


def job_of(task: Any) -> str | None:
    """The running job's task id (kept across retries and redeliveries), if any."""
    return getattr(getattr(task, "request", None), "id", None) or None


def new_owner(task: Any = None) -> str:
    """A claim owner, unique per attempt: ``<task id>/<host>:<pid>/<nonce>``.

    The task id comes first so that a later attempt of the *same job* can recognise the
    claim as its own dead predecessor's (see :func:`same_job_prefix`).
    """
    return f"{job_of(task) or '-'}/{socket.gethostname()}:{os.getpid()}/{uuid.uuid4().hex[:12]}"


def same_job_prefix(task: Any) -> str | None:
    """Owner prefix of claims made by earlier attempts of the running job.

    Celery runs a job again (a retry, a lost-worker retry, a redelivery) only once the
    previous attempt has ended, so such a claim may be taken over at once, without waiting
    for its lease: otherwise a child killed mid-side-effect and retried at once would find
    its own claim "live" and skip, leaving the row in progress with no message left.
    """
    job = job_of(task)
    return None if job is None else f"{job}/"


def lease_for(task: Any, lease_s: float | None) -> float:
    """``lease_s`` if given, else the running task's hard time limit."""
    if lease_s is None:
        lease_s = getattr(task, "time_limit", None) if task is not None else None
    if lease_s is None:
        raise ConfigError(
            "no lease: pass lease_s=... (outside a task there is no hard time limit to default to)"
        )
    if isinstance(lease_s, bool) or float(lease_s) <= 0:
        raise ConfigError(f"lease_s must be a number of seconds > 0, got {lease_s!r}")
    return float(lease_s)
