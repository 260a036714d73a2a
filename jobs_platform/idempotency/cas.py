"""Status compare-and-swap: a side effect runs only for the delivery that moved the row.

A side-effecting task names the status change it performs on one of the app's own rows
(``open -> charging -> paid``). Before the side effect runs, one conditional ::

    UPDATE invoices SET status='charging', claimed_by=:owner, claim_expires_at=:lease
     WHERE id=:id AND (status IN ('open') OR (status='charging' AND claim_expires_at < :now))

is committed on its own. One row changed: this delivery owns the claim and runs the side
effect, outside any transaction. Zero rows: the row is done, or a live claimant holds it,
so this delivery is a duplicate and returns without the side effect (logged and counted).
An exception releases the claim (status back, only if we still own it) and goes on to the
retry policy; success writes the done state, again only if we still own the claim.

The statements are the leased claim of :mod:`.claim` (shared with the key table): of two
racing deliveries exactly one changes the row, on PostgreSQL and on SQLite.

The window this cannot close: a claimant that dies *after* the side effect and *before*
writing the done state leaves a claim whose lease expires, and the redelivered message
runs the side effect again. Pass the task's stable idempotency key to the downstream
service (``Idempotency-Key``) so that second call returns the first result.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import sqlalchemy as sa

from jobs_platform.clock import utcnow
from jobs_platform.errors import ConfigError, LostRace, PermanentError, SkipTransition
from jobs_platform.history import qualified_name
from jobs_platform.idempotency import events
from jobs_platform.idempotency.claim import (
    Claim,
    Clock,
    LeasedClaims,
    current_task,
    lease_for,
    new_owner,
    same_job_prefix,
)

P = ParamSpec("P")
R = TypeVar("R")

logger = logging.getLogger("jobs_platform.idempotency")


def claim_columns(
    owner: str = "claimed_by", expires: str = "claim_expires_at"
) -> list[sa.Column[Any]]:
    """The two columns a guarded table needs next to its status column."""
    return [
        sa.Column(owner, sa.String(200), nullable=True),
        sa.Column(expires, sa.DateTime(timezone=True), nullable=True),
    ]


class Transition:
    """One guarded status change on ``table``: ``from_`` -> ``to`` (in progress) -> ``done``."""

    def __init__(
        self,
        table: sa.Table,
        *,
        from_: str | Sequence[str],
        to: str,
        done: str,
        release_to: str | None = None,
        id_column: str = "id",
        status_column: str = "status",
        owner_column: str = "claimed_by",
        expires_column: str = "claim_expires_at",
    ) -> None:
        self.table = table
        self.from_ = (from_,) if isinstance(from_, str) else tuple(from_)
        self.to = to
        self.done = done
        for name in (id_column, status_column, owner_column, expires_column):
            if name not in table.c:
                raise ConfigError(
                    f"transition on {table.name!r}: no column {name!r} "
                    "(add jobs_platform.idempotency.claim_columns() to the table)"
                )
        if not self.from_ or to in self.from_ or done in (to, *self.from_):
            raise ConfigError(
                f"transition on {table.name!r}: from {self.from_}, to {to!r} and done {done!r} "
                "must be distinct states"
            )
        self.release_to = release_to or self.from_[0]
        if self.release_to in (to, done):
            raise ConfigError(f"transition on {table.name!r}: release_to must be a claimable state")
        self.claims = LeasedClaims(
            table,
            held=to,
            id_column=id_column,
            state_column=status_column,
            owner_column=owner_column,
            expires_column=expires_column,
        )
        self.id = self.claims.id
        self.status = self.claims.state
        self.owner = self.claims.owner
        self.expires = self.claims.expires

    def __repr__(self) -> str:
        return f"Transition({self.table.name}: {'|'.join(self.from_)} -> {self.to} -> {self.done})"

    def claim(
        self,
        engine: sa.Engine,
        row_id: Any,
        *,
        owner: str,
        lease_s: float,
        now: dt.datetime,
        same_job: str | None = None,
    ) -> Claim:
        """Take the row (committed before returning) or raise :class:`SkipTransition`.

        ``same_job``: owner prefix of earlier attempts of this job, whose claims may be
        taken over at once (:func:`jobs_platform.idempotency.claim.same_job_prefix`).
        """
        with engine.begin() as conn:
            claim = self.claims.take(
                conn,
                row_id,
                free=self.status.in_(self.from_),
                owner=owner,
                lease_s=lease_s,
                now=now,
                same_job=same_job,
            )
        if claim is not None:
            return claim
        raise self._why_not(engine, row_id)

    def _why_not(self, engine: sa.Engine, row_id: Any) -> Exception:
        # Read after the failed UPDATE, only to say why; the decision was the UPDATE's.
        with engine.connect() as conn:
            row = conn.execute(
                sa.select(self.status, self.owner, self.expires).where(self.id == row_id)
            ).first()
        if row is None:
            return PermanentError(f"{self.table.name} has no row {self.id.name}={row_id!r}")
        status, owner, expires = row
        if status == self.to:
            return LostRace(
                f"{self.table.name}[{row_id!r}] is {status!r}, claimed by {owner} until {expires}",
                status=status,
            )
        return SkipTransition(f"{self.table.name}[{row_id!r}] is {status!r}", status=status)

    def release(self, engine: sa.Engine, claim: Claim) -> bool:
        """Put the row back to ``release_to`` if ``claim`` still owns it."""
        return self._move(engine, claim, self.release_to, {})

    def finish(
        self, engine: sa.Engine, claim: Claim, values: Mapping[str, Any] | None = None
    ) -> bool:
        """Write the done state (and ``values``) if ``claim`` still owns the row."""
        return self._move(engine, claim, self.done, values or {})

    def _move(
        self, engine: sa.Engine, claim: Claim, status: str, values: Mapping[str, Any]
    ) -> bool:
        moved = {**values, self.status.name: status, self.owner.name: None, self.expires.name: None}
        with engine.begin() as conn:
            return self.claims.settle(conn, claim.row_id, claim.owner, moved)


def transition(
    guard: Transition,
    *,
    id_arg: str,
    engine: Callable[[], sa.Engine],
    lease_s: float | None = None,
    done_values: Callable[[Any], Mapping[str, Any]] | None = None,
    clock: Clock = utcnow,
) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Run the decorated function only for the delivery that wins ``guard``'s claim.

    ``id_arg`` names the argument holding the row id; ``engine`` returns the engine of the
    app's database (called per attempt, so per process); ``lease_s`` defaults to the running
    task's hard time limit; ``done_values(result)`` gives extra columns written with the done
    state. A duplicate returns ``None``. Put it under ``@app.task(...)``.
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R | None]:
        signature = inspect.signature(fn)
        if id_arg not in signature.parameters:
            raise ConfigError(f"{fn.__qualname__}: transition id_arg {id_arg!r} is not a parameter")

        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
            row_id = signature.bind(*args, **kwargs).arguments[id_arg]
            task = current_task()
            task_name = getattr(task, "name", None) or qualified_name(fn)
            eng = engine()
            try:
                claim = guard.claim(
                    eng,
                    row_id,
                    owner=new_owner(task),
                    lease_s=lease_for(task, lease_s),
                    now=clock(),
                    same_job=same_job_prefix(task),
                )
            except SkipTransition as skip:
                events.skipped(
                    task_name, "transition", "%s: duplicate skipped: %s", task_name, skip
                )
                return None
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                _release_quietly(guard, eng, claim, task_name)
                raise
            values = done_values(result) if done_values is not None else None
            if not guard.finish(eng, claim, values):
                # Our lease ran out and another delivery took the row over: it repeats the side
                # effect, and the downstream idempotency key makes that repeat harmless.
                logger.warning(
                    "%s: claim on %s[%r] was lost before the done state was written",
                    task_name,
                    guard.table.name,
                    row_id,
                    extra={"event": "jobs.transition.lease_lost", "task_name": task_name},
                )
            return result

        # Celery checks call arguments against the wrapper's own signature; show it fn's.
        guarded.__signature__ = signature  # type: ignore[attr-defined]
        return guarded

    return decorate


def _release_quietly(guard: Transition, engine: sa.Engine, claim: Claim, task_name: str) -> None:
    """Release after a failure; if that fails too, the lease still frees the row."""
    try:
        if not guard.release(engine, claim):
            logger.warning(
                "%s: claim %r was already lost when releasing it",
                task_name,
                claim,
                extra={"event": "jobs.transition.lease_lost", "task_name": task_name},
            )
    except Exception:
        logger.exception(
            "%s: could not release %r; it frees itself when its lease expires",
            task_name,
            claim,
            extra={"event": "jobs.transition.release_failed", "task_name": task_name},
        )
