"""Idempotency keys: claim a key before a side effect, record its result after.

For side effects on services that cannot dedupe themselves (an email provider, a
webhook), the platform keeps one row per logical side effect in ``idempotency_keys``
(``key`` is UNIQUE). A handler :meth:`~IdempotencyKeys.claim`\\ s the key; the first
claimant runs the side effect and :meth:`~IdempotencyKeys.record`\\ s its result; every
later delivery gets that result back instead of running it again. A failure that shows
the call never reached the other side (a refused connection, an unresolvable host, a
connect timeout, a :class:`~jobs_platform.errors.PermanentError`)
:meth:`~IdempotencyKeys.release`\\ s the key so the retry can claim it at once; any other
failure (a read timeout, a reset connection, a 5xx) may hide a side effect that happened,
so the claim is kept until its lease runs out. A claim carries a lease (the leased claim
of :mod:`jobs_platform.idempotency.claim`, shared with the status CAS): a crashed
claimant's key can be taken over once the lease ran out. Rows expire after
``JOBS_IDEMPOTENCY_KEY_TTL`` and are then treated as never seen (and purged).

:meth:`~IdempotencyKeys.run_once` wraps the three steps::

    keys = IdempotencyKeys.for_app(self.app)
    return keys.run_once(self.idempotency_key, send, task=self.name)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import sqlalchemy as sa

from jobs_platform.clock import as_utc, utcnow
from jobs_platform.db import engine_for
from jobs_platform.errors import ConfigError, KeyInUse, PermanentError
from jobs_platform.idempotency import events
from jobs_platform.idempotency.claim import (
    Clock,
    LeasedClaims,
    current_task,
    lease_for,
    new_owner,
    same_job_prefix,
)
from jobs_platform.idempotency.model import CLAIMED, DONE, idempotency_keys
from jobs_platform.retry.classify import never_sent

T = TypeVar("T")

MAX_KEY_LENGTH = 255

Outcome = Literal["claimed", "done", "busy"]

logger = logging.getLogger("jobs_platform.idempotency")

#: Prefix given to the owner of a claim kept after a failure whose outcome is unknown. The
#: failed attempt has ended, so Celery's next attempt of the same job would take the claim
#: over at once (``same_job``); the prefix stops that, so the claim holds until its lease.
KEPT_PREFIX = "kept:"

#: A key is claimed on its ``key`` column; ``expires_at`` is the row's TTL, not the lease.
_CLAIMS = LeasedClaims(
    idempotency_keys,
    held=CLAIMED,
    id_column="key",
    state_column="state",
    owner_column="owner",
    expires_column="lease_expires_at",
)


@dataclasses.dataclass(frozen=True)
class KeyClaim:
    """What :meth:`IdempotencyKeys.claim` found: ours to run, done already, or held elsewhere."""

    key: str
    outcome: Outcome
    owner: str | None = None
    #: The recorded result when ``outcome == "done"``.
    result: Any = None
    #: When the holder's lease runs out, when ``outcome == "busy"``.
    lease_expires_at: dt.datetime | None = None

    @property
    def claimed(self) -> bool:
        return self.outcome == "claimed"


class IdempotencyKeys:
    """The ``idempotency_keys`` table of one database (PostgreSQL or SQLite)."""

    def __init__(self, database_url: str, *, ttl_s: float, clock: Clock = utcnow) -> None:
        if ttl_s <= 0:
            raise ConfigError(f"idempotency key ttl must be > 0 seconds, got {ttl_s}")
        self.database_url = database_url
        self.ttl_s = float(ttl_s)
        self.clock = clock

    @classmethod
    def for_app(cls, app: Any) -> IdempotencyKeys:
        settings = app.jobs_settings
        return cls(settings.database_url, ttl_s=settings.idempotency_key_ttl)

    @property
    def engine(self) -> sa.Engine:
        return engine_for(self.database_url)

    def claim(
        self,
        key: str,
        *,
        task: str,
        lease_s: float,
        owner: str | None = None,
        same_job: str | None = None,
    ) -> KeyClaim:
        """Claim ``key`` (committed on return) unless it is done or held by a live claimant.

        Inside a task, ``owner`` and ``same_job`` (claims of earlier attempts of the running
        job, taken over at once) come from the task.
        """
        _check_key(key)
        running = current_task()
        owner = owner or new_owner(running)
        same_job = same_job or same_job_prefix(running)
        now = self.clock()
        t = idempotency_keys.c
        # Claiming a key (re)starts its life: no result yet, a full TTL from now.
        fresh = {
            "task": task,
            "result": None,
            "created_at": now,
            "updated_at": now,
            "expires_at": now + dt.timedelta(seconds=self.ttl_s),
        }
        with self.engine.begin() as conn:
            # A new key is inserted claimed; an existing one is taken over only if its
            # claimant is gone (lease ran out, or an earlier attempt of this job) or the row
            # outlived its TTL (then it counts as never seen, even when done).
            claimed = _CLAIMS.insert(conn, key, owner=owner, lease_s=lease_s, now=now, values=fresh)
            if claimed is None:
                claimed = _CLAIMS.take(
                    conn,
                    key,
                    free=t.expires_at < now,
                    owner=owner,
                    lease_s=lease_s,
                    now=now,
                    same_job=same_job,
                    values=fresh,
                )
            if claimed is not None:
                return KeyClaim(key, "claimed", owner)
            row = conn.execute(
                sa.select(t.state, t.owner, t.result, t.lease_expires_at).where(t.key == key)
            ).one()
        if row.state == DONE:
            return KeyClaim(key, "done", row.owner, row.result)
        return KeyClaim(
            key,
            "busy",
            row.owner,
            lease_expires_at=(row.lease_expires_at and as_utc(row.lease_expires_at)),
        )

    def record(self, claim: KeyClaim, result: Any) -> bool:
        """Mark ``claim``'s key done with ``result`` (JSON); False if the claim was lost."""
        done = {
            "state": DONE,
            "result": result,
            "updated_at": self.clock(),
            "lease_expires_at": None,
        }
        with self.engine.begin() as conn:
            return _CLAIMS.settle(conn, claim.key, claim.owner, done)

    def release(self, claim: KeyClaim) -> bool:
        """Forget ``claim``'s key (the side effect did not happen) so a retry can claim it."""
        with self.engine.begin() as conn:
            return _CLAIMS.drop(conn, claim.key, claim.owner)

    def keep(self, claim: KeyClaim) -> KeyClaim | None:
        """Hold ``claim``'s key until its lease runs out, even against the same job's retry.

        For a failure that may hide a side effect that happened. Returns the kept claim
        (its owner renamed with :data:`KEPT_PREFIX`), or None if the claim was lost.
        """
        if claim.owner is None or claim.owner.startswith(KEPT_PREFIX):
            return claim
        kept = dataclasses.replace(claim, owner=KEPT_PREFIX + claim.owner)
        renamed = {"owner": kept.owner, "updated_at": self.clock()}
        with self.engine.begin() as conn:
            return kept if _CLAIMS.settle(conn, claim.key, claim.owner, renamed) else None

    def get(self, key: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(idempotency_keys).where(idempotency_keys.c.key == key)
            ).first()
        return None if row is None else dict(row._mapping)

    def purge_expired(self) -> int:
        """Delete rows past their expiry; returns how many."""
        stmt = sa.delete(idempotency_keys).where(idempotency_keys.c.expires_at < self.clock())
        with self.engine.begin() as conn:
            return int(conn.execute(stmt).rowcount)

    def run_once(
        self, key: str, fn: Callable[[], T], *, task: str, lease_s: float | None = None
    ) -> T:
        """Run ``fn`` once per ``key``; a duplicate gets the recorded result back.

        ``lease_s`` defaults to the running task's hard time limit. While another attempt
        holds the key this raises :class:`KeyInUse` (transient, with ``retry_after_s`` set
        to the rest of the holder's lease: the retry finds the recorded result, or takes
        the key over once the lease ran out). ``fn``'s result must be JSON-serialisable.

        If ``fn`` raises, the key is released (a retry may call at once) only when the error
        shows the call cannot have reached the other side (:func:`cannot_have_reached`).
        Otherwise (a read timeout, a reset connection, a 5xx) the side effect may have
        happened: the claim is kept until its lease runs out, so no attempt calls again
        before then, and the original exception goes on to the retry policy.
        """
        claim = self.claim(key, task=task, lease_s=lease_for(current_task(), lease_s))
        if claim.outcome == "done":
            events.skipped(
                task, "key", "%s: duplicate of %s; returning its recorded result", task, key
            )
            return claim.result  # type: ignore[no-any-return]
        if claim.outcome == "busy":
            raise KeyInUse(
                f"idempotency key {key!r} is held by {claim.owner} until {claim.lease_expires_at}",
                retry_after_s=self._rest_of_lease(claim),
            )
        try:
            result = fn()
        except BaseException as exc:
            self._settle_quietly(claim, task, release=cannot_have_reached(exc))
            raise
        if not self.record(claim, result):
            events.logger.warning(
                "%s: the claim on %s was lost before its result was recorded",
                task,
                key,
                extra={"event": "jobs.key.lease_lost", "task_name": task},
            )
        return result

    def _rest_of_lease(self, claim: KeyClaim) -> float | None:
        if claim.lease_expires_at is None:
            return None
        rest = (claim.lease_expires_at - self.clock()).total_seconds()
        # A little past the expiry, so the retry finds the lease over (never 0 s).
        return max(rest, 0.0) + 0.5

    def _settle_quietly(self, claim: KeyClaim, task: str, *, release: bool) -> None:
        """Release or keep after a failure; a database error must not replace the original."""
        try:
            settled = self.release(claim) if release else self.keep(claim) is not None
        except Exception:
            logger.exception(
                "%s: could not %s the claim on %s; it frees itself when its lease expires",
                task,
                "release" if release else "keep",
                claim.key,
                extra={"event": "jobs.key.release_failed", "task_name": task},
            )
            return
        if not settled:
            logger.warning(
                "%s: the claim on %s was already lost when the attempt failed",
                task,
                claim.key,
                extra={"event": "jobs.key.lease_lost", "task_name": task},
            )
        elif not release:
            logger.warning(
                "%s: the call under %s failed and may have happened; the key stays claimed "
                "until its lease runs out",
                task,
                claim.key,
                extra={"event": "jobs.key.kept", "task_name": task},
            )


def cannot_have_reached(exc: BaseException) -> bool:
    """True if ``exc`` shows the call never reached the other side, so it may run again now:
    a connect-phase error (:func:`jobs_platform.retry.classify.never_sent`), or a
    :class:`~jobs_platform.errors.PermanentError` (the task fails for good; a replay may run
    again)."""
    return isinstance(exc, PermanentError) or never_sent(exc)


def _check_key(key: str) -> None:
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ConfigError(f"an idempotency key is 1-{MAX_KEY_LENGTH} characters, got {key!r}")
