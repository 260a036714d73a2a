"""The capture pipeline: spool first, then the database; never raises, never silent.

``capture(letter)``:

1. redact the configured keys;
2. push the JSON to the durable spool on the coordination Redis (:mod:`.spool`);
3. insert-or-ignore the row (values made storable by :meth:`DeadLetter.row`), retrying
   only transient errors (:func:`is_transient`), a bounded number of times (tenacity);
4. on success remove the spool entry, then alert (log line, counter, webhook) *only if
   the row is new*; on a transient failure leave it spooled for the drainer
   (:mod:`.drainer`); on an error of the row itself (it would fail forever) move it to
   ``<spool>:rejected`` (``jobs.dlq.rejected``, ``stage="rejected"``).

After a transient failure a per-process circuit breaker skips step 3 for
``JOBS_DLQ_DRAIN_INTERVAL`` seconds (doubling while the database keeps failing, up to
:data:`BREAKER_MAX_OPEN_S`, then one single probe): a pool child does not hold its slot
for attempts x connect timeout on every failing task during an outage; the main
process's drainer writes the spooled dead letters.

In the worker's main process (poison messages, time limits, lost workers, rejections,
expiries) step 3 is handed off (``capture(letter, handoff=...)``: the hooks wake the
drainer thread): the consumer's event loop never waits on the database.

If the spool is unreachable too, the database write is still tried; if both fail, the
whole dead letter is logged at CRITICAL (``jobs.dlq.lost``) so that it exists at least in
the logs, and ``jobs_dead_letter_write_failures_total{stage="lost"}`` counts it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy.exc
import tenacity

from jobs_platform import coordination
from jobs_platform.deadletter import alerts
from jobs_platform.deadletter.metrics import (
    DEAD_LETTERS,
    POISON_LABEL,
    SPOOLED,
    WRITE_FAILURES,
)
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.spool import Spool
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.process_local import per_process

logger = logging.getLogger("jobs_platform.deadletter")

#: Longest time the circuit breaker keeps a process off a failing database.
BREAKER_MAX_OPEN_S = 60.0

#: Errors of the database being unreachable, overloaded or not ready, not of the row.
_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.DisconnectionError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    OSError,
)
#: SQLSTATE classes that blame the data of one row: 22 data exception (a NUL in JSONB, a
#: value too long), 23 integrity constraint, 54 program limit (a JSONB too large).
_ROW_SQLSTATE_CLASSES = ("22", "23", "54")


def _sqlstate(exc: BaseException) -> str | None:
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return str(code) if code else None


def is_transient(exc: BaseException) -> bool:
    """Whether a failed dead-letter write may succeed later unchanged (an outage).

    Transient: connection, pool and timeout errors, and any server error whose SQLSTATE
    does not blame the row (a missing table before the migration, a permission, a
    serialization failure): the entry stays spooled and the drain pass stops. Anything
    else (an integrity or data error, a value the driver cannot send) will fail forever:
    the entry is moved aside instead of blocking the spool.
    """
    if getattr(exc, "connection_invalidated", False):
        return True  # SQLAlchemy saw the connection drop under the statement
    code = _sqlstate(exc)
    if code is not None:
        return code[:2] not in _ROW_SQLSTATE_CLASSES
    return isinstance(exc, _TRANSIENT_TYPES)


def rejected_why(letter: DeadLetter, exc: BaseException) -> str:
    """One short line naming the dead letter the database refused and its error (the
    driver's own message, first line: SQLAlchemy's adds the statement and every value)."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines() or [""]
    error = lines[0].strip()[:200] or type(cause).__name__
    return f"{letter.task_name}[{letter.task_id}]: {type(exc).__name__}: {error}"


class _Breaker:
    """Per-process circuit breaker for the database writes of the failure path.

    After a transient failure the process stops trying the database (dead letters stay
    spooled for the main process's drainer) for ``open_s`` seconds, doubling on each
    failure in a row up to :data:`BREAKER_MAX_OPEN_S`; then one single attempt probes it.
    """

    def __init__(self, open_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.open_s = open_s
        self.clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._until = 0.0

    def is_open(self) -> bool:
        return self.clock() < self._until

    def probing(self) -> bool:
        """Closed after failures: the next write is a single probe, not a full retry."""
        return self._failures > 0

    def failed(self) -> None:
        with self._lock:
            self._failures += 1
            doubled = self.open_s * 2 ** min(self._failures - 1, 16)  # no overflow, ever
            wait = min(doubled, max(BREAKER_MAX_OPEN_S, self.open_s))
            self._until = self.clock() + wait

    def succeeded(self) -> None:
        with self._lock:
            self._failures = 0
            self._until = 0.0


class DeadLetterSink:
    def __init__(self, settings: Any, *, spool_url: str | None = None) -> None:
        """``settings``: the app's settings table (``app.jobs_settings``)."""
        self.settings = settings
        self.store = DeadLetterStore(settings.database_url)
        self.spool = Spool(spool_url or coordination.url_of(settings), settings.dlq_spool_key)
        self.redact_keys = tuple(
            k.strip() for k in settings.dlq_redact_keys.split(",") if k.strip()
        )
        self.breaker = _Breaker(settings.dlq_drain_interval)

    # -- the failure path ----------------------------------------------------------------

    def capture(
        self, letter: DeadLetter, *, handoff: Callable[[], None] | None = None
    ) -> int | None:
        """Store ``letter`` (see the module docstring); its new row id, if written now.

        With ``handoff`` (the worker's main process, whose event loop must not wait on a
        database) the pipeline stops after the spool and calls ``handoff()`` (which wakes
        the drainer), unless the spool failed. An open circuit breaker (the database
        failed in this process recently) stops there too.
        """
        letter = letter.redact(self.redact_keys)
        text = letter.to_json()
        spooled = self._spool(text, letter)
        if spooled and handoff is not None:
            handoff()
            return None
        if spooled and self.breaker.is_open():
            WRITE_FAILURES.labels("db").inc()
            logger.error(
                "jobs.dlq.write_failed: dead letter for %s[%s] kept in the spool %r: the "
                "database failed in this process moments ago, the worker's drainer will "
                "write it",
                letter.task_name,
                letter.task_id,
                self.spool.key,
                extra={"event": "jobs.dlq.write_failed"},
            )
            return None
        try:
            row_id = self.write(letter)
        except Exception as exc:
            if spooled and not is_transient(exc):
                self._reject(text, letter, exc)
                return None
            stage = "db" if spooled else "lost"
            WRITE_FAILURES.labels(stage).inc()
            if spooled:
                logger.error(
                    "jobs.dlq.write_failed: dead letter for %s[%s] kept in the spool %r "
                    "until the database answers: %s",
                    letter.task_name,
                    letter.task_id,
                    self.spool.key,
                    exc,
                    extra={"event": "jobs.dlq.write_failed"},
                )
            else:
                logger.critical(
                    "jobs.dlq.lost: neither the spool nor the database took the dead letter "
                    "for %s[%s] (database: %r); its content follows so it can be restored "
                    "by hand: %s",
                    letter.task_name,
                    letter.task_id,
                    exc,
                    text,
                    extra={"event": "jobs.dlq.lost"},
                )
            return None
        if spooled:
            self._unspool(text)
        return row_id

    def _spool(self, text: str, letter: DeadLetter) -> bool:
        try:
            self.spool.push(text, task_id=letter.task_id)
        except Exception as exc:
            WRITE_FAILURES.labels("spool").inc()
            logger.error(
                "jobs.dlq.spool_failed: could not spool the dead letter for %s[%s]: %s",
                letter.task_name,
                letter.task_id,
                exc,
                extra={"event": "jobs.dlq.spool_failed"},
            )
            return False
        SPOOLED.inc()
        return True

    def _unspool(self, text: str) -> None:
        try:
            self.spool.remove(text)
        except Exception as exc:
            # The row is stored; a leftover entry is re-inserted as a no-op by the drainer.
            logger.warning(
                "jobs.dlq.unspool_failed: %s", exc, extra={"event": "jobs.dlq.unspool_failed"}
            )

    def _reject(self, text: str, letter: DeadLetter, exc: BaseException) -> None:
        """Move a spooled entry the database refuses for good to ``<spool>:rejected``."""
        self.report_rejected(letter, exc)
        try:
            self.spool.reject(text, rejected_why(letter, exc))
        except Exception as move_exc:  # still spooled: the next drain pass moves it
            logger.warning(
                "jobs.dlq.reject_failed: could not move the entry aside: %s",
                move_exc,
                extra={"event": "jobs.dlq.reject_failed"},
            )

    def report_rejected(self, letter: DeadLetter, exc: BaseException) -> None:
        WRITE_FAILURES.labels("rejected").inc()
        logger.error(
            "jobs.dlq.rejected: the database refused the dead letter for %s[%s] for good; "
            "moved to %r for a person to look at: %s",
            letter.task_name,
            letter.task_id,
            self.spool.rejected_key,
            exc,
            extra={"event": "jobs.dlq.rejected"},
        )

    def write(self, letter: DeadLetter) -> int | None:
        """Insert-or-ignore ``letter``, retrying transient errors only; alert if new."""
        attempts = 1 if self.breaker.probing() else self.settings.dlq_write_attempts
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
            retry=tenacity.retry_if_exception(is_transient),
            reraise=True,
        )
        try:
            row_id: int | None = retrying(self.store.add, letter)
        except Exception as exc:
            if is_transient(exc):
                self.breaker.failed()
            raise
        self.breaker.succeeded()
        if row_id is not None:
            try:
                self._announce(row_id, letter)
            except Exception:  # the row is stored: an alert bug must not re-store it
                logger.exception(
                    "jobs.dlq.alert_failed: dead letter %d stored, but alerting failed",
                    row_id,
                    extra={"event": "jobs.dlq.alert_failed"},
                )
        return row_id

    def _announce(self, row_id: int, letter: DeadLetter) -> None:
        task = POISON_LABEL if letter.reason == "poison" else letter.task_name
        DEAD_LETTERS.labels(task, letter.queue, letter.reason).inc()
        alerts.log_dead_letter(row_id, letter)
        if self.settings.dlq_webhook_url:
            alerts.notifier_for(
                self.settings.dlq_webhook_url, self.settings.dlq_webhook_interval
            ).notify(row_id, letter)


def sink_for(app: Any) -> DeadLetterSink:
    """The sink of ``app`` in this process."""
    return per_process(
        ("dead-letter-sink", id(app)),
        lambda: DeadLetterSink(app.jobs_settings),
    )
