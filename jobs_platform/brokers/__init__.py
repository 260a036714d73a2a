"""The broker behind the queues, chosen by the broker URL's scheme.

::

    interface.py  what the platform asks of a broker: :class:`~.interface.Broker` (pure)
    redis/        the Redis broker (``redis://``, ``rediss://``)
    rabbitmq/     the RabbitMQ broker (``amqp://``, ``amqps://``): quorum queues, with a
                  Redis for coordination (``JOBS_COORDINATION_URL``, required)
    memory.py     kombu's in-process transport (``memory://``), for pure unit tests

Everything else in the library reaches the broker through :func:`of` (an app) or
:func:`for_url`; nothing else names a transport. :func:`check_urls` is the brokers' part of
the settings check: every service URL a broker (or coordination) will be given.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from jobs_platform.brokers import memory
from jobs_platform.brokers import rabbitmq as rabbitmq_broker
from jobs_platform.brokers import redis as redis_broker
from jobs_platform.brokers.interface import Broker
from jobs_platform.env import env_name
from jobs_platform.errors import ConfigError
from jobs_platform.urls import masked

#: Scheme -> broker. ``memory`` only ever as ``memory://`` (no worker runs on it).
BY_SCHEME: dict[str, Broker] = {
    **dict.fromkeys(redis_broker.SCHEMES, redis_broker.BROKER),
    **dict.fromkeys(rabbitmq_broker.SCHEMES, rabbitmq_broker.BROKER),
    memory.SCHEME: memory.BROKER,
}
#: The schemes a real worker can run on, in the order error messages name them.
WORKER_SCHEMES: tuple[str, ...] = (*redis_broker.SCHEMES, *rabbitmq_broker.SCHEMES)

__all__ = [
    "BY_SCHEME",
    "WORKER_SCHEMES",
    "Broker",
    "check_broker_url",
    "check_coordination_url",
    "check_urls",
    "default_result_backend",
    "for_url",
    "of",
    "scheme_of",
]


def scheme_of(url: str) -> str:
    return urllib.parse.urlsplit(url).scheme


def for_url(url: str) -> Broker:
    """The broker for ``url`` (the settings check its scheme when the app is created)."""
    return BY_SCHEME[scheme_of(url)]


def of(app: Any) -> Broker:
    """The broker of a jobs-platform app."""
    return for_url(str(app.jobs_settings.broker_url))


# -- the settings' URLs ------------------------------------------------------------------------


def check_urls(values: Mapping[str, Any]) -> None:
    """The broker, result backend (when it is a broker's Redis) and coordination URLs of a
    settings table (``Settings.__post_init__`` calls this after the rules)."""
    check_broker_url(values["broker_url"], setting=env_name("broker_url"))
    if scheme_of(values["result_backend"]) in redis_broker.SCHEMES:
        check_broker_url(values["result_backend"], setting=env_name("result_backend"))
    if values["coordination_url"]:
        check_coordination_url(values["coordination_url"], setting=env_name("coordination_url"))
    elif scheme_of(values["broker_url"]) not in (*redis_broker.SCHEMES, memory.SCHEME):
        raise ConfigError(
            f"{env_name('broker_url')}={masked(values['broker_url'])!r} is not a Redis, so "
            f"{env_name('coordination_url')} must name one (redis[s]://HOST[:PORT][/DB]): "
            "locks, rate limits, beat, metric sums, the dead-letter spool and (unless "
            f"{env_name('result_backend')} says otherwise) results live there"
        )


def default_result_backend(broker_url: str, coordination_url: str) -> str:
    """The result backend when ``JOBS_RESULT_BACKEND`` is empty: the broker's Redis on
    Redis; on another broker the coordination Redis (RabbitMQ's ``rpc://`` keeps results
    only for the caller that waits on them)."""
    if scheme_of(broker_url) in redis_broker.SCHEMES or not coordination_url:
        return broker_url
    return coordination_url


def check_broker_url(url: str, *, setting: str) -> str:
    """Refuse a URL of no broker the platform has, naming ``setting``; the broker checks
    the rest of its shape (:meth:`~jobs_platform.brokers.interface.Broker.check_url`).

    Checked when the app is created, so a typo fails with the setting's name instead of a
    ``ModuleNotFoundError`` from kombu or a hang at the first ``.delay()``.
    """
    if url == memory.URL:
        return url
    why = "(the brokers jobs-platform runs on: Redis, RabbitMQ)"
    scheme = _scheme(url, setting, WORKER_SCHEMES, why)
    BY_SCHEME[scheme].check_url(url, setting=setting)
    return url


def check_coordination_url(url: str, *, setting: str) -> str:
    """Coordination needs a Redis: ``redis[s]://[user:password@]host[:port][/db]``."""
    why = "(coordination: locks, limits, beat, metric sums, needs a Redis)"
    _scheme(url, setting, redis_broker.SCHEMES, why)
    redis_broker.BROKER.check_url(url, setting=setting)
    return url


def _scheme(url: str, setting: str, allowed: Sequence[str], why: str) -> str:
    """``url``'s scheme if it is one of ``allowed``; else ConfigError naming ``setting``."""
    shown = masked(url)
    try:
        scheme = urllib.parse.urlsplit(url).scheme
    except ValueError as exc:
        raise ConfigError(f"{setting}={shown!r} is not a valid URL: {exc}") from None
    if scheme not in allowed:
        spelt = " or ".join(f"{name}://" for name in allowed)
        raise ConfigError(f"{setting}={shown!r}: the scheme must be {spelt} {why}")
    return scheme
