"""The restore sweep for a worker without an event loop (gevent).

kombu's Redis transport restores expired unacknowledged messages from the event loop's
timer; a worker without one (gevent) only reaches its restore call when a poll returns
nothing, which an idle BRPOP (it answers every second) never lets happen
(celery/kombu#1025, celery/celery#4968). A fleet of gevent workers would never redeliver a
lost message, so they run kombu's own restore on the worker's timer, on a connection of
their own (:class:`jobs_platform.cooperative.steps.Cooperative` schedules it).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("jobs_platform.cooperative")


class RestoreSweep:
    """kombu's restore cycle for a worker without an event loop (module doc): on the consuming
    channel, so the worker's lease is renewed and lost workers' jobs are put back
    (:mod:`.liveness`); before the consumer exists, the visibility-timeout sweep alone, on a
    connection of its own."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.app = worker.app
        #: How often to sweep: the transport's restore interval.
        options = self.app.conf.broker_transport_options or {}
        self.interval_s = float(options.get("unacked_restore_interval") or 10)
        self._connection: Any = None

    def consuming_channel(self) -> Any:
        """The channel the worker's task consumer takes jobs on (None before it starts)."""
        consumer = getattr(getattr(self.worker, "consumer", None), "task_consumer", None)
        return getattr(consumer, "channel", None)

    def __call__(self) -> None:
        try:
            channel = self.consuming_channel()
            if channel is None:
                if self._connection is None:
                    self._connection = self.app.connection_for_write()
                channel = self._connection.default_channel
            channel.qos.restore_visible(num=channel.unacked_restore_limit, interval=1)
        except Exception:
            logger.warning(
                "jobs.watchdog.restore_failed: expired messages could not be restored now; "
                "next sweep in one interval",
                exc_info=True,
                extra={"event": "jobs.watchdog.restore_failed"},
            )
            self.close()

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None
