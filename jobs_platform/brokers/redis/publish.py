"""A bulk dispatch on the Redis broker: one pipeline per chunk, and a ping before any write.

kombu's Redis channel can batch publishes (``create_publish_batch``: the commands of many
messages in one pipeline, flushed once); :class:`PipelinedSession` uses it, and on a
channel that cannot batch safely (retries configured, another transport) publishes one
message at a time.
"""

from __future__ import annotations

import sys
from typing import Any

from kombu.utils.functional import retry_over_time


class PipelinedSession:
    """Where a bulk's messages go: kombu's Redis publish batch (a pipeline per
    :meth:`flush`), or one publish at a time (module doc)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        batchable = getattr(channel, "supports_batch_publish", False)
        create = getattr(channel, "create_publish_batch", None)
        self.session = create(max_size=sys.maxsize) if batchable and create else None

    @property
    def pipelined(self) -> bool:
        return self.session is not None

    def publish(self, message: dict[str, Any], **options: Any) -> None:
        if self.session is None:
            self.channel.basic_publish(message, **options)
        else:
            self.session.publish(message, **options)

    def flush(self) -> None:
        if self.session is not None:
            self.session.flush()

    def close(self, *, discard: bool) -> None:
        if self.session is not None:
            if discard:
                self.session.discard()
            self.session.close()


def reach(app: Any, channel: Any) -> None:
    """Reach the broker before anything is written, retried as a single publish is: a
    broker down at the start fails the bulk with nothing sent (and heals a pooled
    connection that went stale)."""
    acquire = getattr(channel, "conn_or_acquire", None)
    if acquire is None:
        return  # not Redis (memory:// in unit tests): nothing to reach

    def ping() -> None:
        with acquire() as client:
            client.ping()

    policy = app.conf.task_publish_retry_policy or {}
    errors = (
        ConnectionError,
        TimeoutError,
        OSError,
        *getattr(channel.connection, "connection_errors", ()),
    )
    retry_over_time(
        ping,
        errors,
        max_retries=policy.get("max_retries", 2),
        interval_start=policy.get("interval_start", 0),
        interval_step=policy.get("interval_step", 0.2),
        interval_max=policy.get("interval_max", 0.2),
    )
