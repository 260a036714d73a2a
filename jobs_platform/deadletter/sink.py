"""The capture pipeline: spool first, then the database; never raises, never silent.

``capture(letter)``:

1. redact the configured keys;
2. push the JSON to the durable spool on the broker (:mod:`.spool`);
3. insert-or-ignore the row, with a bounded number of attempts (tenacity);
4. on success remove the spool entry, then alert (log line, counter, webhook) *only if
   the row is new*; on failure leave it spooled for :meth:`DeadLetterSink.drain`.

In the worker's main process (poison messages, time limits, lost workers, rejections,
expiries) step 3 is left to the drainer thread, woken at once: the consumer's event loop
never waits on the database.

If the spool is unreachable too, the database write is still tried; if both fail, the
whole dead letter is logged at CRITICAL (``jobs.dlq.lost``) so that it exists at least in
the logs, and ``jobs_dead_letter_write_failures_total{stage="lost"}`` counts it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

import tenacity

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
from jobs_platform.settings import Settings

logger = logging.getLogger("jobs_platform.deadletter")

#: Spool entries moved per drain pass.
DRAIN_BATCH = 500
#: Set when a dead letter was spooled for the drainer (see :mod:`.worker`).
WAKE_DRAINER = threading.Event()


class DeadLetterSink:
    def __init__(self, settings: Settings, *, spool_url: str | None = None) -> None:
        self.settings = settings
        self.store = DeadLetterStore(settings.database_url)
        self.spool = Spool(spool_url or settings.broker_url, settings.dlq_spool_key)
        self.redact_keys = tuple(
            k.strip() for k in settings.dlq_redact_keys.split(",") if k.strip()
        )
        self._drain_lock = threading.Lock()

    # -- the failure path ----------------------------------------------------------------

    def capture(self, letter: DeadLetter, *, defer: bool = False) -> int | None:
        """Store ``letter`` (see the module docstring); its new row id, if written now.

        ``defer=True`` (the worker's main process, whose event loop must not wait on a
        database) stops after the spool and wakes the drainer, unless the spool failed.
        """
        letter = letter.redact(self.redact_keys)
        text = letter.to_json()
        spooled = self._spool(text, letter)
        if spooled and defer:
            WAKE_DRAINER.set()
            return None
        try:
            row_id = self._write(letter)
        except Exception as exc:
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
                    "for %s[%s]; its content follows so it can be restored by hand: %s",
                    letter.task_name,
                    letter.task_id,
                    text,
                    extra={"event": "jobs.dlq.lost"},
                )
            return None
        if spooled:
            self._unspool(text)
        return row_id

    def _spool(self, text: str, letter: DeadLetter) -> bool:
        try:
            self.spool.push(text)
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

    def _write(self, letter: DeadLetter) -> int | None:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.settings.dlq_write_attempts),
            wait=tenacity.wait_exponential(multiplier=0.1, max=2.0),
            reraise=True,
        )
        row_id: int | None = retrying(self.store.add, letter)
        if row_id is not None:
            self._announce(row_id, letter)
        return row_id

    def _announce(self, row_id: int, letter: DeadLetter) -> None:
        task = POISON_LABEL if letter.reason == "poison" else letter.task_name
        DEAD_LETTERS.labels(task, letter.queue, letter.reason).inc()
        alerts.log_dead_letter(row_id, letter)
        if self.settings.dlq_webhook_url:
            alerts.notifier_for(
                self.settings.dlq_webhook_url, self.settings.dlq_webhook_interval
            ).notify(row_id, letter)

    # -- the drainer ---------------------------------------------------------------------

    def drain(self, *, limit: int = 100_000) -> int:
        """Move spooled dead letters into the database; how many entries were settled.

        Stops at the first database failure (the rest waits for the next pass), so an
        outage costs one bounded attempt per pass, not one per entry.
        """
        settled = 0
        with self._drain_lock:
            while settled < limit:
                batch = self.spool.peek(min(DRAIN_BATCH, limit - settled))
                if not batch:
                    break
                for text in batch:
                    try:
                        letter = DeadLetter.from_json(text)
                    except Exception as exc:
                        logger.error(
                            "jobs.dlq.unreadable: spool entry moved aside: %s",
                            exc,
                            extra={"event": "jobs.dlq.unreadable"},
                        )
                        self.spool.quarantine(text)
                        continue
                    self._write(letter)  # raises on a database failure: stop this pass
                    self.spool.remove(text)
                    settled += 1
        return settled

    def drain_quietly(self) -> int:
        """:meth:`drain` for background loops: failures are logged and counted, not raised."""
        try:
            return self.drain()
        except Exception as exc:
            WRITE_FAILURES.labels("db").inc()
            depth: Any = "?"
            with contextlib.suppress(Exception):
                depth = self.spool.depth()
            logger.error(
                "jobs.dlq.drain_failed: %s dead letter(s) wait in the spool %r: %s",
                depth,
                self.spool.key,
                exc,
                extra={"event": "jobs.dlq.drain_failed"},
            )
            return 0


_sinks: dict[tuple[int, int], DeadLetterSink] = {}
_sinks_lock = threading.Lock()


def sink_for(app: Any) -> DeadLetterSink:
    """The sink of ``app`` in this process."""
    key = (os.getpid(), id(app))
    with _sinks_lock:
        sink = _sinks.get(key)
        if sink is None:
            sink = _sinks[key] = DeadLetterSink(
                app.jobs_settings, spool_url=str(app.conf.broker_url)
            )
        return sink
