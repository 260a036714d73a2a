"""The worker bootstep: apply migrations at start, then drain the spool in the background.

Runs in the worker's main process only. The drainer thread makes a pass every
``JOBS_DLQ_DRAIN_INTERVAL`` seconds, and at once when the main process spooled a dead
letter (those are never written to the database from the consumer's event loop).

Start-up migration is bounded: a database that is down at start must not stop the worker
(dead letters wait in the spool meanwhile), and the drainer retries the migration before
each pass until it succeeds.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

from jobs_platform.deadletter.wake import WAKE_DRAINER
from jobs_platform.urls import masked

logger = logging.getLogger("jobs_platform.deadletter")

MIGRATE_ATTEMPTS = 3


def migrate(url: str) -> bool:
    """Apply migrations with bounded retries; whether the schema is now current."""
    # Two workers starting at once can race on the first CREATE TABLE; the loser's retry
    # finds the schema in place.
    import tenacity

    from jobs_platform import db

    try:
        tenacity.Retrying(
            stop=tenacity.stop_after_attempt(MIGRATE_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )(db.upgrade, url)
    except Exception as exc:
        logger.error(
            "jobs.db.migrate_failed: could not migrate %s: %s",
            masked(url),
            exc,
            extra={"event": "jobs.db.migrate_failed"},
        )
        return False
    return True


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
            self._migrated = migrate(settings.database_url)
        self._thread = threading.Thread(
            target=self._run, args=(app,), name="jobs-dlq-drainer", daemon=True
        )
        self._thread.start()

    def _run(self, app: Any) -> None:
        settings = app.jobs_settings
        while not self._stop.is_set():
            # Cleared before the pass: a dead letter spooled meanwhile wakes the next one.
            WAKE_DRAINER.clear()
            if settings.auto_migrate and not self._migrated:
                self._migrated = migrate(settings.database_url)
            _sink(app).drain_quietly()
            WAKE_DRAINER.wait(settings.dlq_drain_interval)

    def stop(self, parent: Any) -> None:
        """Warm shutdown: stop the thread, then one last pass (what is left stays spooled).

        Runs once however often it is called.
        """
        if self._halt():
            _sink(parent.app).drain_quietly()

    def terminate(self, parent: Any) -> None:
        """Cold shutdown: stop the thread, no last pass (the spool keeps what is left)."""
        self._halt()

    def _halt(self) -> bool:
        """Stop the drainer thread; whether it was running."""
        thread, self._thread = self._thread, None
        if thread is None:
            return False
        self._stop.set()
        WAKE_DRAINER.set()
        thread.join(timeout=10)
        return True


def _sink(app: Any) -> Any:
    from jobs_platform.deadletter.sink import sink_for  # SQLAlchemy: only when draining

    return sink_for(app)
