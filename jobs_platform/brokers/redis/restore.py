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
    """Put messages whose visibility timeout expired back on their queues (module doc)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        #: How often to sweep: the transport's restore interval.
        options = app.conf.broker_transport_options or {}
        self.interval_s = float(options.get("unacked_restore_interval") or 10)
        self._connection: Any = None

    def __call__(self) -> None:
        try:
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
