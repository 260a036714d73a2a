"""A worker's unacknowledged messages when its broker connection dies: kept, not fatal.

When the broker goes away, Celery first *collects* the dead kombu connection (which
detaches it from its transport) and then closes it. Closing the channel restores the
messages the worker fetched and had not acknowledged (running or reserved jobs) to their
queues; but with the transport detached, kombu 5.7's Redis channel cannot even build a
client for that (``AttributeError: 'NoneType' object has no attribute 'hostname'`` in
``_connparams``), which is not one of the errors Celery ignores there: "Unrecoverable
error", and the worker exits after every broker restart that finds it holding a job.

:class:`QoS` skips that restore when the connection is already detached. Nothing is lost:
the messages are still in the broker's ``unacked`` hash, held by the dead connection's
lease, and any worker's upkeep puts them back on their queues once that lease has run out
(:mod:`.liveness`; at least once, seconds later).

The same detached channel is where a job fetched before the outage is acknowledged when it
finishes after it: kombu fails the same way there (``'NoneType' object has no attribute
'client'``), out of Celery's ``ack_log_error``, and the worker exits. The acknowledgement
goes through a client built from the connection parameters the channel had while it was
live; if the broker is still down, that is a connection error, which Celery logs and
survives (the message then waits in ``unacked`` like the others). A message given back
(rejected to be requeued) on such a channel stays in ``unacked`` too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis

from jobs_platform.brokers.redis.fetch import KillSafeQoS

logger = logging.getLogger("jobs_platform.broker")


class QoS(KillSafeQoS):
    """The kill-safe QoS (:mod:`.fetch`) whose restore at close gives way
    when the connection is gone."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Read while the channel is live (kombu creates its QoS on first use, connected):
        # the server's parameters, or for Sentinel the Sentinels and the master's name.
        self._jobs_make_pool: Callable[[], Any] = self.channel.jobs_pool_factory()
        self._jobs_pool: Any = None

    def _detached(self) -> bool:
        return getattr(self.channel.connection, "client", None) is None

    def _live_client(self, client: Any) -> Any:
        """``client``, or one of this QoS's own when the channel's connection is detached."""
        if client is not None or not self._detached():
            return client
        if self._jobs_pool is None:
            self._jobs_pool = self._jobs_make_pool()
        return redis.Redis(connection_pool=self._jobs_pool)

    @contextmanager
    def pipe_or_acquire(self, pipe: Any = None, client: Any = None) -> Iterator[Any]:
        with super().pipe_or_acquire(pipe, self._live_client(client)) as acquired:
            yield acquired

    def restore_by_tag(self, tag: Any, client: Any = None, leftmost: bool = False) -> Any:
        if client is None and self._detached():
            # A restore needs the channel's exchange table, gone with its connection (kombu
            # would drop the unacked entry and push nothing): the sweep restores it later.
            logger.warning(
                "jobs.broker.unacked_kept: a message given back after the connection died "
                "stays in the unacked hash until its connection's lease runs out",
                extra={"event": "jobs.broker.unacked_kept", "messages": 1},
            )
            return None
        return super().restore_by_tag(tag, client=client, leftmost=leftmost)

    def restore_unacked(self, client: Any = None) -> Any:
        if client is None and self._detached():
            held = len(self._delivered)
            if held:
                logger.warning(
                    "jobs.broker.unacked_kept: %d unacknowledged message(s) stay in the "
                    "broker's unacked hash after the connection died; they return to their "
                    "queues when its lease runs out",
                    held,
                    extra={"event": "jobs.broker.unacked_kept", "messages": held},
                )
            self._delivered.clear()
            return None
        return super().restore_unacked(client)
