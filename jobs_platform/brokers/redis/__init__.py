"""The Redis broker: kombu's Redis transport, made kill-safe, poison-proof and durable.

::

    transport.py  the transport Celery loads by name: kombu's Redis channel composed with
                  the pieces below                                           (kombu)
    fetch.py      kill-safe fetch: a message leaves its list and enters
                  ``unacked`` in one Lua script                               (kombu)
    reconnect.py  the QoS that keeps held jobs when the connection dies     (kombu)
    poison.py     bad input in a queue list becomes a dead letter            (kombu)
    divert.py     which delayed messages wait in the store                  (pure)
    delayed.py    the durable store of long delays: scripts and reads       (Redis)
    releaser.py   the bootstep that releases due jobs in every worker        (Celery)
    options.py    the transport options the pieces share                    (pure)
    layout.py     kombu's queue lists read at a flat cost (metrics, health)  (Redis)
    restore.py    the restore sweep for workers without an event loop        (kombu)
    publish.py    a bulk dispatch's pipelined publish                        (kombu)
    fair.py       fair queues: keyed messages taken round robin across keys  (Redis)

The transport and the bootstep are given to Celery by name, so a producer
(``import jobs_platform``) loads neither.

``sentinel://h1:26379;sentinel://h2:26379#MASTER`` (:mod:`jobs_platform.redis_urls`) is the
same broker behind Redis Sentinel: the transport's Sentinel variant
(:class:`.transport.SentinelTransport`) and every client the platform builds from the URL
follow the master through a failover (docs/sentinel.md).
"""

from __future__ import annotations

import ssl
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from jobs_platform.brokers.interface import (
    DeliveryTimeout,
    FairKey,
    InflightState,
    PublishSession,
    QueueState,
    Sweep,
)
from jobs_platform.brokers.redis import fair, layout, options, publish
from jobs_platform.brokers.redis.delayed import RedisDelayedStore
from jobs_platform.brokers.redis.restore import RestoreSweep
from jobs_platform.errors import ConfigError
from jobs_platform.redis_urls import SENTINEL_SCHEME, is_sentinel, parse_sentinel, sentinel_kwargs
from jobs_platform.redis_urls import client as redis_client_for
from jobs_platform.urls import masked

SCHEMES = ("redis", "rediss", SENTINEL_SCHEME)
#: Celery's ``broker_transport`` for a Redis broker URL (the URL itself is unchanged).
TRANSPORT = "jobs_platform.brokers.redis.transport:Transport"
#: ... and for a ``sentinel://`` one.
SENTINEL_TRANSPORT = "jobs_platform.brokers.redis.transport:SentinelTransport"
#: The releaser bootstep.
RELEASER_STEP = "jobs_platform.brokers.redis.releaser:ReleaserStep"
#: ``control_cls``: revoke reaches stored jobs (:mod:`jobs_platform.delayed.control`).
CONTROL = "jobs_platform.delayed.control:Control"
#: redis-py's errors that mean the server did not answer (named: this module imports none
#: of the classes it would not otherwise need).
_DOWN = frozenset({"redis.exceptions.ConnectionError", "redis.exceptions.TimeoutError"})


class RedisBroker:
    name = "Redis"
    #: kombu's base list (priority 0) is served first.
    highest_priority = 0
    #: Keyed messages wait in per-key lists the kill-safe fetch rotates (fair.py).
    no_fair_queues: str | None = None

    # -- configuration and start-up -------------------------------------------------------

    def check_url(self, url: str, *, setting: str) -> None:
        """``redis[s]://[user:password@]host[:port][/db]``, checked when the app is created,
        so a typo fails with the setting's name instead of a ``ModuleNotFoundError`` from
        kombu or a hang at the first ``.delay()``."""
        shown = masked(url)
        if is_sentinel(url):
            try:
                parse_sentinel(url)
            except ValueError as exc:
                raise ConfigError(f"{setting}={shown!r}: {exc}") from None
            return
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ConfigError(f"{setting}={shown!r} is not a valid URL: {exc}") from None
        if not parts.hostname or not url.startswith(f"{parts.scheme}://"):
            raise ConfigError(
                f"{setting}={shown!r} has no host; expected {parts.scheme}://HOST[:PORT][/DB]"
            )
        database = parts.path.lstrip("/")
        if database and not database.isdigit():
            raise ConfigError(
                f"{setting}={shown!r}: the path must be a database number such as /0, "
                f"not {parts.path!r}"
            )
        if port == 0:
            raise ConfigError(f"{setting}={shown!r}: port 0 is not a port")

    def celery_config(self, settings: Any) -> dict[str, Any]:
        # A dispatch to an unreachable broker fails within dispatch_timeout (T): each
        # connect attempt gets T/4; the result backend (subscribed before the publish)
        # retries until T/2.
        timeout = settings.dispatch_timeout
        transport = {
            "visibility_timeout": settings.visibility_timeout,
            # kombu sweeps expired unacked messages every interval x throttle seconds (~100 s
            # by default); a throttle of 1 makes the interval the real sweep period.
            "unacked_restore_interval": settings.unacked_restore_interval,
            "unacked_restore_throttle": 1,
            # The sweep's lock: kombu keeps it 300 s, so a worker killed mid-sweep would stop
            # every restore for 5 minutes; restore_by_tag is a WATCH transaction, so a short
            # lock that two sweeps overlap under is safe.
            "unacked_mutex_expire": 10,
            "socket_connect_timeout": timeout / 4,
        }
        backend_retry = {
            "max_retries": 100,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
            "timeout": timeout / 2,
        }
        config: dict[str, Any] = {
            # Long delays wait in the durable store (options.py names its two entries).
            "broker_transport_options": {**transport, **options.transport_options(settings)},
            "result_backend_transport_options": {**transport, "retry_policy": backend_retry},
            "redis_socket_connect_timeout": timeout / 4,
            "broker_transport": (
                SENTINEL_TRANSPORT if is_sentinel(settings.broker_url) else TRANSPORT
            ),
        }
        _name_masters(config, settings, timeout / 4)
        if urllib.parse.urlsplit(settings.broker_url).scheme == "rediss":
            # kombu turns TLS on from the *scheme* only when it picks the transport itself;
            # named explicitly, it needs it said. Same default as kombu's (with its warning).
            query = urllib.parse.urlsplit(settings.broker_url).query
            if "ssl_" not in query:
                config["broker_use_ssl"] = {"ssl_cert_reqs": ssl.CERT_NONE}
        return config

    def delivery_timeout(self, settings: Any) -> DeliveryTimeout:
        # A live worker's jobs are never swept (its lease keeps them fresh: .liveness), so
        # the visibility timeout bounds no running job, only a lost lease's.
        return DeliveryTimeout(
            "visibility timeout",
            "JOBS_VISIBILITY_TIMEOUT",
            float(settings.visibility_timeout),
            bounds_running_jobs=False,
        )

    def install(self, app: Any) -> None:
        """Every worker releases due delayed jobs; revoke reaches a stored job."""
        app.steps["worker"].add(RELEASER_STEP)
        app.control_cls = CONTROL

    def check_live(self, app: Any) -> None:
        live = float((app.conf.broker_transport_options or {}).get("visibility_timeout", 0))
        configured = float(app.jobs_settings.visibility_timeout)
        if live != configured:
            raise ConfigError(
                f"broker visibility_timeout {live:g} s differs from JOBS_VISIBILITY_TIMEOUT "
                f"{configured:g} s; set it only through jobs-platform settings"
            )

    # -- reading the queues -----------------------------------------------------------------

    def queue_states(self, app: Any, queues: Sequence[str]) -> Mapping[str, QueueState]:
        return layout.read_queues(_client(app), layout.BrokerLayout.from_app(app, queues))

    def inflight(self, app: Any) -> InflightState | None:
        return layout.read_inflight(_client(app), layout.BrokerLayout.from_app(app))

    def fair_keys(self, app: Any, queues: Sequence[str]) -> list[FairKey]:
        where = layout.BrokerLayout.from_app(app, queues)
        rings = {queue: where.ring(queue) for queue in where.queues}
        return fair.keys_with_work(_client(app), rings)

    def ping(self, url: str, timeout_s: float) -> tuple[bool, str]:
        """Redis PING with short socket timeouts (a black-holed broker fails in
        ``timeout_s``)."""
        client = redis_client_for(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            start = time.monotonic()
            client.ping()
            took = (time.monotonic() - start) * 1000
            return True, f"{masked(url)} answered PING in {took:.0f} ms"
        except redis.RedisError as exc:
            inner = getattr(exc, "orig", None) or exc
            said = f"{type(inner).__name__}: {inner}" if str(inner) else type(inner).__name__
            return False, f"{masked(url)} does not answer: {said}"
        finally:
            client.close()

    # -- dispatch -----------------------------------------------------------------------------

    def is_down(self, exc: BaseException) -> bool:
        return any(f"{cls.__module__}.{cls.__qualname__}" in _DOWN for cls in type(exc).__mro__)

    def reach(self, app: Any, channel: Any) -> None:
        publish.reach(app, channel)

    def publish_session(self, channel: Any) -> PublishSession:
        return publish.PipelinedSession(channel)

    # -- delays and worker upkeep ----------------------------------------------------------

    def delayed_store(self, app: Any) -> RedisDelayedStore | None:
        return RedisDelayedStore(_client(app), options.keys_for(app))

    def restore_sweep(self, worker: Any) -> Sweep | None:
        return RestoreSweep(worker)


def _name_masters(config: dict[str, Any], settings: Any, timeout_s: float) -> None:
    """kombu's and Celery's Sentinel options from a ``sentinel://`` broker or result backend
    URL: the master's name (carried by the URL's fragment, which neither of them reads) and
    bounded timeouts towards the Sentinels themselves."""
    for url, options_key in (
        (settings.broker_url, "broker_transport_options"),
        (settings.result_backend_url, "result_backend_transport_options"),
    ):
        if is_sentinel(url):
            config[options_key]["master_name"] = parse_sentinel(url).master
            config[options_key]["sentinel_kwargs"] = sentinel_kwargs(timeout_s)


def _client(app: Any) -> redis.Redis:
    client: redis.Redis = options.client_for(app)
    return client


BROKER = RedisBroker()
