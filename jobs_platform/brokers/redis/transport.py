"""kombu's Redis transport, storing long delays instead of queueing them.

Every task message reaches Redis through ``Channel._put`` (producers' ``apply_async`` and
workers' retries alike), so this is the one place that sees them all. A message whose
wait is not safely below the visibility timeout (:mod:`.divert`) is written to the
delayed store instead of its queue, byte-for-byte as it would have been queued (task id,
priority, headers), to be released when due (:mod:`.releaser`). A message with a fairness
key goes to its key's list of the queue's ring (:mod:`.fair`). Everything else is kombu's
own code path.

The URL stays ``redis://`` (or ``rediss://``; ``sentinel://`` for :class:`SentinelTransport`):
Celery's ``broker_transport`` setting names this class
(:meth:`jobs_platform.brokers.redis.RedisBroker.celery_config`). Its channel is
also the one that takes messages kill-safe (:mod:`.fetch`), keeps held jobs when the
connection dies (:mod:`.reconnect`) and refuses bad input in a queue without stopping the
worker (:mod:`.poison`).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from redis import sentinel as redis_sentinel

from jobs_platform.brokers.interface import FAIRNESS_HEADER
from jobs_platform.brokers.redis import divert, fair, options, reconnect
from jobs_platform.brokers.redis.delayed import DEFAULT_PREFIX, DelayedJob, Keys, store_args
from jobs_platform.brokers.redis.fetch import KillSafeFetch
from jobs_platform.brokers.redis.poison import PoisonGuardChannel
from jobs_platform.redis_urls import SENTINEL_SCHEME


class Channel(KillSafeFetch, PoisonGuardChannel):
    """A Redis channel that diverts long delays to the delayed store (and guards against
    poison in the queue, :mod:`.poison`; takes messages kill-safe, :mod:`.fetch`)."""

    #: What a kill-safe fetch takes passes the poison screen, as BRPOP's replies do.
    kill_safe_admit = PoisonGuardChannel.jobs_screen
    #: Kill-safe bookkeeping, and a broker that dies under held jobs is not fatal.
    QoS = reconnect.QoS

    #: Seconds kept below the visibility timeout (transport option ``jobs_delay_margin``).
    jobs_delay_margin: float = 0.0
    #: The store's key prefix (transport option ``jobs_delayed_prefix``).
    jobs_delayed_prefix: str = DEFAULT_PREFIX

    from_transport_options = (
        *kombu_redis.Channel.from_transport_options,
        options.MARGIN,
        options.PREFIX,
        options.WORKER_LEASE,
    )

    #: The client ``_create_client`` hands out, for the pool it was built on.
    _jobs_client: Any = None

    def jobs_pool_factory(self) -> Callable[[], Any]:
        """What builds a pool to the broker once the channel's connection is detached
        (:mod:`.reconnect`): read now, while the channel is live."""
        params = dict(self._connparams())
        return lambda: redis.ConnectionPool(**params)

    def _create_client(self, asynchronous: bool = False) -> Any:
        # kombu builds a new redis.Redis for every publish, ack and restore (~150 µs of
        # CPU each, several per task); one per pool does as well: a client only checks
        # connections out of its pool. A new pool (reconnect) gets a new client.
        if asynchronous:
            return super()._create_client(asynchronous=True)
        pool = self.pool
        client = self._jobs_client
        if client is None or client.connection_pool is not pool:
            client = self._jobs_client = super()._create_client()
        return client

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        now_s = time.time()
        due = divert.due_ms(
            message,
            now_s=now_s,
            visibility_timeout_s=float(self.visibility_timeout),
            margin_s=float(self.jobs_delay_margin),
        )
        if due is None:
            key = self._jobs_fair_key(message)
            if key is None:
                super()._put(queue, message, **kwargs)
                return
            ring = fair.ring_key(self.global_keyprefix + queue, self.sep)
            args = fair.publish_args(ring, key, kombu_redis.dumps(message))
        else:
            args = store_args(Keys(self.jobs_delayed_prefix), self._job(queue, message, due, now_s))
        batch = kwargs.pop("_publish_batch", None)
        if batch is not None:
            batch.add("eval", *args)  # flushed with the batch's other commands
            return
        with self.conn_or_acquire() as client:
            # EVAL is not among the commands kombu's global_keyprefix client rewrites:
            # every key passed is used as given.
            client.eval(*args)

    def _purge(self, queue: str) -> int:
        # A queue's keyed jobs are purged with it (kombu's purge knows only its lists).
        purged = int(super()._purge(queue))
        ring = fair.ring_key(self.global_keyprefix + queue, self.sep)
        with self.conn_or_acquire() as client:
            return purged + int(client.eval(fair.PURGE_SCRIPT, 1, ring))

    def _jobs_fair_key(self, message: dict[str, Any]) -> str | None:
        """The fairness key of a message to queue round robin (:mod:`.fair`); None for one
        with a priority (it goes to its priority list, as kombu's) or no key."""
        key = (message.get("headers") or {}).get(FAIRNESS_HEADER)
        if not isinstance(key, str) or not key:
            return None
        if self._get_message_priority(message, reverse=False) != 0:
            return None
        return key

    def _job(self, queue: str, message: dict[str, Any], due: int, now_s: float) -> DelayedJob:
        headers = message["headers"]
        priority = self._get_message_priority(message, reverse=False)
        return DelayedJob(
            id=str(headers["id"]),
            list=self.global_keyprefix + self._q_for_pri(queue, priority),
            payload=kombu_redis.dumps(message),  # what kombu's _put would LPUSH
            task=str(headers.get("task", "")),
            queue=queue,
            priority=priority,
            due=due,
            eta=str(headers.get("eta")),
            stored=round(now_s * 1000),
        )


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    """kombu's Redis transport using :class:`Channel`."""

    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):  # type: ignore[misc]
    """:class:`Channel` on the master a set of Sentinels names (``sentinel://``): kombu's
    Sentinel channel builds the connection pool (asking the Sentinels for the master, and
    again after a failover); everything above the pool is the platform's channel."""

    from_transport_options = tuple(
        dict.fromkeys(
            (*Channel.from_transport_options, *kombu_redis.SentinelChannel.from_transport_options)
        )
    )

    def jobs_pool_factory(self) -> Callable[[], Any]:
        # The Sentinels, the master's name and the connection parameters, read while the
        # channel is live, as kombu's _sentinel_managed_pool reads them.
        params = {k: v for k, v in self._connparams().items() if k not in ("host", "port")}
        sentinels = [
            (entry.hostname, entry.port or self.connection.default_port)
            for entry in map(urllib.parse.urlsplit, self.connection.client.alt)
            if entry.scheme == SENTINEL_SCHEME and entry.hostname
        ]
        master = str(self.master_name)
        kwargs = getattr(self, "sentinel_kwargs", None)
        credentials = {k: params[k] for k in ("username", "password") if k in params}

        def pool() -> Any:
            sentinel = redis_sentinel.Sentinel(  # type: ignore[no-untyped-call]
                sentinels, sentinel_kwargs=kwargs, **params
            )
            client = sentinel.master_for(master, redis.Redis, **credentials)  # type: ignore[no-untyped-call]
            return client.connection_pool

        return pool


class SentinelTransport(Transport):
    """:class:`Transport` behind Redis Sentinel (kombu's ``SentinelTransport``, with the
    platform's channel)."""

    default_port = kombu_redis.SentinelTransport.default_port
    Channel = SentinelChannel
