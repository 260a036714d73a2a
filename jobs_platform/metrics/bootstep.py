"""The worker bootstep that turns recording on and reports the worker alive.

It is built when the worker applies its blueprint, before the pool forks its children, so
recording is active in the main process and every child inherits that (each child then
builds its own buffer and flush thread on its first count, :mod:`.counters`).

The main process's recorder carries the worker's hostname: every flush also writes
``hostname -> now`` into :data:`~.keys.WORKERS_KEY`, from which the exporter derives
``celery_worker_up`` without task events or a broadcast. This says the main process is
alive, not that it still consumes: the ``health`` command's canary jobs check that.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps

from jobs_platform import coordination
from jobs_platform.metrics import counters

logger = logging.getLogger("jobs_platform.metrics")


class MetricsStep(bootsteps.StartStopStep):  # type: ignore[misc]
    label = "metrics recorder"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        app = parent.app
        counters.activate(
            coordination.url_of(app.jobs_settings),
            interval_s=counters.flush_interval(app.jobs_settings),
        )

    def start(self, parent: Any) -> None:
        recorder = counters.current()
        if recorder is None:  # pragma: no cover - activated in __init__
            return
        recorder.hostname = str(parent.hostname)
        recorder.start()
        recorder.flush()  # reported alive now, not one interval later

    def stop(self, parent: Any) -> None:
        """Warm or cold shutdown: flush the main process's counts, leave the live list,
        stop recording (an in-process worker started again activates it anew)."""
        if not counters.deactivate(farewell=True):
            logger.warning(
                "jobs.metrics.lost_at_shutdown: the last counts of %s could not be written",
                parent.hostname,
                extra={"event": "jobs.metrics.lost_at_shutdown"},
            )

    def terminate(self, parent: Any) -> None:
        self.stop(parent)
