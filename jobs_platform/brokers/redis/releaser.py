"""The releaser: every worker moves due jobs from the store onto their queues.

:class:`ReleaserStep` (a bootstep, in the worker's main process) runs a thread that calls
:func:`release_now` every ``JOBS_DELAYED_RELEASE_INTERVAL`` seconds. Every worker runs
one: the release script is atomic, so more releasers only mean more availability, never a
second copy. A job is released at most one interval (plus the time to move the jobs
due before it) after its due time, while at least one worker is up; with none, due jobs
wait in the store and go out when the first one starts. Anything else (beat, a cron job,
a test) may call :func:`release_now` too.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import bootsteps

from jobs_platform.brokers.redis.delayed import Released, release_due
from jobs_platform.brokers.redis.options import client_for, keys_for

logger = logging.getLogger("jobs_platform.delayed")


def release_interval(app: Any) -> float:
    return float(app.jobs_settings.delayed_release_interval)


def release_now(app: Any, *, limit: int | None = None) -> Released:
    """Move every job of ``app``'s store that is due now onto its queue; what was moved."""
    done = release_due(client_for(app), keys_for(app), limit=limit)
    if done.unreadable:
        logger.error(
            "jobs.delayed.unreadable: %d stored entr(y/ies) were not readable jobs; moved to %r",
            done.unreadable,
            keys_for(app).unreadable,
            extra={"event": "jobs.delayed.unreadable", "count": done.unreadable},
        )
    if done.count:
        logger.debug(
            "jobs.delayed.released: %d job(s), at most %d ms late",
            done.count,
            max(done.lateness_ms),
            extra={"event": "jobs.delayed.released", "count": done.count},
        )
    return done


class ReleaserStep(bootsteps.StartStopStep):  # type: ignore[misc]
    label = "delayed-job releaser"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(parent.app,), name="jobs-delayed-releaser", daemon=True
        )
        self._thread.start()

    def _run(self, app: Any) -> None:
        interval = release_interval(app)
        failing = False
        while not self._stop.is_set():
            try:
                release_now(app)
            except Exception as exc:  # Redis down: the jobs stay stored; retry next pass
                if not failing:
                    logger.error(
                        "jobs.delayed.release_failed: due jobs wait in the store until "
                        "Redis answers: %s",
                        exc,
                        extra={"event": "jobs.delayed.release_failed"},
                    )
                failing = True
            else:
                if failing:
                    logger.info(
                        "jobs.delayed.release_resumed", extra={"event": "jobs.delayed.resumed"}
                    )
                failing = False
            self._stop.wait(interval)

    def stop(self, parent: Any) -> None:
        self._halt()

    def terminate(self, parent: Any) -> None:
        self._halt()

    def _halt(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=10)
