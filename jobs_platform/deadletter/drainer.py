"""The drainer: moves spooled dead letters into the table, in the worker and on demand.

:class:`DeadLetterStep` (a bootstep, in the worker's main process only) applies the
migrations at start (:func:`jobs_platform.db.try_upgrade`), then runs a thread that makes
a pass every ``JOBS_DLQ_DRAIN_INTERVAL`` seconds, and at once when the main process
spooled a dead letter (:func:`wake`: those are never written to the database from the
consumer's event loop). ``celery -A APP dlq drain`` makes one pass by hand.

Start-up migration is bounded: a database that is down at start must not stop the worker
(dead letters wait in the spool meanwhile), and the thread retries the migration before
each pass until it succeeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from typing import Any

from celery import bootsteps

from jobs_platform import db
from jobs_platform.deadletter.metrics import WRITE_FAILURES
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.sink import DeadLetterSink, is_transient, rejected_why, sink_for
from jobs_platform.process_local import fork_safe, per_process

logger = logging.getLogger("jobs_platform.deadletter")

#: Spool entries read per batch of a pass.
DRAIN_BATCH = 500

#: Set when a dead letter was spooled for the drainer thread (see :func:`wake`).
WAKE = threading.Event()


def wake() -> None:
    """Ask the drainer thread for a pass now (the main process spooled a dead letter)."""
    WAKE.set()


@dataclasses.dataclass
class Drained:
    """What one pass did, counted entry by entry (another drainer may work meanwhile)."""

    #: Written to the table (or found there already: the unique key absorbs a copy).
    moved: int = 0
    #: Refused by the database for good: moved to ``<spool>:rejected``.
    rejected: int = 0
    #: Not a dead letter at all: moved to ``<spool>:unreadable``.
    unreadable: int = 0
    #: Still in the spool when the pass ended.
    left: int = 0
    #: The database error (an outage) that ended the pass early, if one did.
    stopped_by: BaseException | None = None

    @property
    def settled(self) -> int:
        return self.moved + self.rejected


class Drainer:
    """Drain passes over one sink's spool, one at a time in this process."""

    def __init__(self, sink: DeadLetterSink) -> None:
        self.sink = sink
        self._lock = threading.Lock()

    def drain(self, *, limit: int = 100_000) -> Drained:
        """Move up to ``limit`` spooled dead letters into the database; what was done.

        A *transient* database failure ends the pass (:attr:`Drained.stopped_by`; the rest
        waits for the next one), so an outage costs one bounded attempt per pass, not one
        per entry. An entry the database refuses for good (see :func:`.sink.is_transient`)
        is moved to ``<spool>:rejected``, logged (``jobs.dlq.rejected``) and counted
        (``stage="rejected"``), and the pass goes on: one bad entry never blocks the rest.
        A broker error is raised.
        """
        done = Drained()
        with self._lock:
            self._pass(done, limit)
            done.left = self.sink.spool.depth()
        return done

    def _pass(self, done: Drained, limit: int) -> None:
        spool = self.sink.spool
        while done.settled < limit:
            batch = spool.peek(min(DRAIN_BATCH, limit - done.settled))
            if not batch:
                return
            for text in batch:
                try:
                    letter = DeadLetter.from_json(text)
                except Exception as exc:
                    self._quarantine(text, exc)
                    done.unreadable += 1
                    continue
                try:
                    self.sink.write(letter)
                except Exception as exc:
                    if is_transient(exc):
                        done.stopped_by = exc  # the database is down: end this pass
                        return
                    self.sink.report_rejected(letter, exc)
                    spool.reject(text, rejected_why(letter, exc))  # a broker error ends it
                    done.rejected += 1
                else:
                    spool.remove(text)
                    done.moved += 1

    def _quarantine(self, text: str, exc: BaseException) -> None:
        WRITE_FAILURES.labels("unreadable").inc()
        logger.error(
            "jobs.dlq.unreadable: spool entry moved to %r: %s",
            self.sink.spool.unreadable_key,
            exc,
            extra={"event": "jobs.dlq.unreadable"},
        )
        self.sink.spool.quarantine(text)

    def drain_quietly(self) -> Drained:
        """:meth:`drain` for background loops: failures are logged and counted, not raised."""
        try:
            done = self.drain()
        except Exception as exc:  # the broker (or an unexpected bug): nothing to count on
            depth: Any = "?"
            with contextlib.suppress(Exception):
                depth = self.sink.spool.depth()
            self._report_failure(depth, exc)
            return Drained()
        if done.stopped_by is not None:
            self._report_failure(done.left, done.stopped_by)
        return done

    def _report_failure(self, waiting: Any, exc: BaseException) -> None:
        WRITE_FAILURES.labels("db").inc()
        logger.error(
            "jobs.dlq.drain_failed: %s dead letter(s) wait in the spool %r: %s",
            waiting,
            self.sink.spool.key,
            exc,
            extra={"event": "jobs.dlq.drain_failed"},
        )


def drainer_for(app: Any) -> Drainer:
    """The drainer of ``app``'s spool in this process."""
    return per_process(("dead-letter-drainer", id(app)), lambda: Drainer(sink_for(app)))


class DeadLetterStep(bootsteps.StartStopStep):  # type: ignore[misc]
    label = "dead-letter drainer"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._migrated = False

    def start(self, parent: Any) -> None:
        app = parent.app
        settings = app.jobs_settings
        self._stop.clear()
        if settings.auto_migrate:
            self._migrated = db.try_upgrade(settings.database_url)
        self._thread = threading.Thread(
            target=self._run, args=(app,), name="jobs-dlq-drainer", daemon=True
        )
        self._thread.start()

    def _run(self, app: Any) -> None:
        settings = app.jobs_settings
        while not self._stop.is_set():
            # Cleared before the pass: a dead letter spooled meanwhile wakes the next one.
            WAKE.clear()
            with fork_safe():  # a pool process forked meanwhile would hang in SQLite
                if settings.auto_migrate and not self._migrated:
                    self._migrated = db.try_upgrade(settings.database_url)
                drainer_for(app).drain_quietly()
            WAKE.wait(settings.dlq_drain_interval)

    def stop(self, parent: Any) -> None:
        """Warm shutdown: stop the thread, then one last pass (what is left stays spooled).

        Runs once however often it is called.
        """
        if self._halt():
            drainer_for(parent.app).drain_quietly()

    def terminate(self, parent: Any) -> None:
        """Cold shutdown: stop the thread, no last pass (the spool keeps what is left)."""
        self._halt()

    def _halt(self) -> bool:
        """Stop the drainer thread; whether it was running."""
        thread, self._thread = self._thread, None
        if thread is None:
            return False
        self._stop.set()
        WAKE.set()
        thread.join(timeout=10)
        return True
