"""The broker behind the queues, chosen by the broker URL's scheme.

::

    interface.py  what the platform asks of a broker: :class:`~.interface.Broker` (pure)
    redis/        the Redis broker (``redis://``, ``rediss://``)
    memory.py     kombu's in-process transport (``memory://``), for pure unit tests

Everything else in the library reaches the broker through :func:`of` (an app) or
:func:`for_url`; nothing else names a transport.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from jobs_platform.brokers import memory
from jobs_platform.brokers import redis as redis_broker
from jobs_platform.brokers.interface import Broker

#: Scheme -> broker. ``memory`` only ever as ``memory://`` (no worker runs on it).
BY_SCHEME: dict[str, Broker] = {
    **dict.fromkeys(redis_broker.SCHEMES, redis_broker.BROKER),
    memory.SCHEME: memory.BROKER,
}
#: The schemes a real worker can run on, in the order error messages name them.
WORKER_SCHEMES: tuple[str, ...] = redis_broker.SCHEMES

__all__ = ["BY_SCHEME", "WORKER_SCHEMES", "Broker", "for_url", "of", "scheme_of"]


def scheme_of(url: str) -> str:
    return urllib.parse.urlsplit(url).scheme


def for_url(url: str) -> Broker:
    """The broker for ``url`` (the settings check its scheme when the app is created)."""
    return BY_SCHEME[scheme_of(url)]


def of(app: Any) -> Broker:
    """The broker of a jobs-platform app."""
    return for_url(str(app.jobs_settings.broker_url))
