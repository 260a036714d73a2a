"""Coordination: the Redis behind everything the fleet agrees on that is not a queue.

Unique-dispatch locks, global rate limits, beat's leader lock, slot records and overlap
markers, the dead-letter spool, metric sums, health's canaries and the watchdog's marks
all live on one Redis, ``JOBS_COORDINATION_URL``. It is the broker's Redis by default (the
broker URL, while the broker is Redis), so a one-Redis deployment needs nothing; a team
that moves its queues elsewhere keeps these here.

::

    lease.py  the one lease primitive: acquire, hold, extend, release by compare-and-delete

Every process has one client per URL (:func:`jobs_platform.process_local.redis_client`),
with socket timeouts of a few seconds: a half-open Redis fails a call, it never hangs a
worker or a web process.
"""

from __future__ import annotations

from typing import Any

import redis

from jobs_platform.coordination.lease import Leases, text
from jobs_platform.process_local import per_process, redis_client

__all__ = ["Leases", "client", "leases", "text", "url_of"]


def url_of(settings: Any) -> str:
    """The coordination Redis of ``settings``: ``JOBS_COORDINATION_URL``, else the broker's."""
    return str(settings.coordination_url or settings.broker_url)


def client(app: Any) -> redis.Redis:
    """This process's client for ``app``'s coordination Redis."""
    return redis_client(url_of(app.jobs_settings))


def leases(url: str) -> Leases:
    """This process's lease scripts on the Redis at ``url``."""
    return per_process(("leases", url), lambda: Leases(redis_client(url)))
