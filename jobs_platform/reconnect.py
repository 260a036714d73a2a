"""A worker's unacknowledged messages when its broker connection dies: kept, not fatal.

When the broker goes away, Celery first *collects* the dead kombu connection (which
detaches it from its transport) and then closes it. Closing the channel restores the
messages the worker fetched and had not acknowledged (running or reserved jobs) to their
queues; but with the transport detached, kombu 5.7's Redis channel cannot even build a
client for that (``AttributeError: 'NoneType' object has no attribute 'hostname'`` in
``_connparams``), which is not one of the errors Celery ignores there: "Unrecoverable
error", and the worker exits after every broker restart that finds it holding a job.

:class:`QoS` skips that restore when the connection is already detached. Nothing is lost:
the messages are still in the broker's ``unacked`` hash, where any worker's sweep puts
them back on their queues once the visibility timeout has passed (at least once, later).
"""

from __future__ import annotations

import logging
from typing import Any

from jobs_platform.fetch import KillSafeQoS

logger = logging.getLogger("jobs_platform.broker")


class QoS(KillSafeQoS):
    """The kill-safe QoS (:mod:`jobs_platform.fetch`) whose restore at close gives way
    when the connection is gone."""

    def restore_unacked(self, client: Any = None) -> Any:
        if client is None and getattr(self.channel.connection, "client", None) is None:
            held = len(self._delivered)
            if held:
                logger.warning(
                    "jobs.broker.unacked_kept: %d unacknowledged message(s) stay in the "
                    "broker's unacked hash after the connection died; the visibility-timeout "
                    "sweep returns them to their queues",
                    held,
                    extra={"event": "jobs.broker.unacked_kept", "messages": held},
                )
            self._delivered.clear()
            return None
        return super().restore_unacked(client)
