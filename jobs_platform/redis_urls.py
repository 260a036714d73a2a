"""What a Redis URL names, and the platform's client for it: one server, or the master a set of
Sentinels names.

::

    redis://[user:password@]host[:port][/db]          one server (also rediss://, unix://)
    sentinel://[user:password@]host[:port][/db];sentinel://...#MASTER
                                                      the master MASTER of these Sentinels

A Sentinel URL is kombu's own (entries separated by ``;``) with the master's name as its
fragment (``#MASTER``; on the last entry, or repeated on every entry). kombu and Celery read
no fragment, so the same string is Celery's broker or result backend URL; the platform
hands the name to them as ``master_name`` (:mod:`jobs_platform.brokers.redis`) and every
client it builds itself (coordination, the delayed store, metrics, health, beat) asks the
Sentinels for the master (redis-py's ``Sentinel.master_for``), so all of them follow a
failover. Carried by the URL, the name reaches every process and command that only has the
URL, and a coordination Redis may be another master than the broker's.

The user, password and ``/db`` are the master's (and its replicas'); kombu connects with the
entry it is on and moves to the next when one fails, so every entry must carry the same
ones. Sentinels are reached without a password (``requirepass`` on the Sentinels
themselves is not supported: keep them on a private network) and without TLS.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

import redis
import redis.sentinel

SENTINEL_SCHEME = "sentinel"
#: A Sentinel's port when an entry names none (kombu's default too).
SENTINEL_PORT = 26379


@dataclasses.dataclass(frozen=True)
class SentinelTarget:
    """The master a ``sentinel://`` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int
    username: str | None
    password: str | None


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SENTINEL_SCHEME}://")


def parse_sentinel(url: str) -> SentinelTarget:
    """The Sentinels, master name, database and credentials of ``url``; ``ValueError`` saying
    what is wrong (the caller names the setting and masks the URL)."""
    sentinels: list[tuple[str, int]] = []
    masters: set[str] = set()
    shared: set[tuple[str | None, str | None, str]] = set()
    for entry in url.split(";"):
        parts = urllib.parse.urlsplit(entry.strip())
        if parts.scheme != SENTINEL_SCHEME or not entry.strip().startswith("sentinel://"):
            raise ValueError(f"every entry must be sentinel://HOST[:PORT], not {entry!r}")
        if not parts.hostname:
            raise ValueError(f"entry {entry!r} has no host")
        if parts.port == 0:
            raise ValueError("port 0 is not a port")
        if parts.query:
            raise ValueError(
                "query options are not supported on a Sentinel URL (no TLS to Sentinel or "
                "the master; kombu reads no options from the URL)"
            )
        database = parts.path.lstrip("/")
        if database and not database.isdigit():
            raise ValueError(f"the path must be a database number such as /0, not {parts.path!r}")
        sentinels.append((parts.hostname, parts.port or SENTINEL_PORT))
        if parts.fragment:
            masters.add(urllib.parse.unquote(parts.fragment))
        shared.add((parts.username, parts.password, database or "0"))
    if not masters:
        raise ValueError(
            "no master name: end the URL with #MASTER, the name the Sentinels monitor "
            "(sentinel://h1:26379;sentinel://h2:26379#mymaster)"
        )
    if len(masters) > 1:
        raise ValueError(f"the entries name different masters: {sorted(masters)}")
    if len(shared) > 1:
        raise ValueError(
            "every entry must carry the same user, password and /db (kombu connects with the "
            "entry it is on and moves to the next when one fails)"
        )
    ((username, password, database),) = shared
    return SentinelTarget(
        sentinels=tuple(sentinels),
        master=masters.pop(),
        db=int(database),
        username=urllib.parse.unquote(username) if username else None,
        password=urllib.parse.unquote(password) if password else None,
    )


def sentinel_kwargs(timeout_s: float) -> dict[str, Any]:
    """How the Sentinels themselves are reached: bounded, so a black-holed Sentinel fails a
    lookup in ``timeout_s`` instead of hanging it (Celery's result backend passes ``{}``,
    no timeout at all, unless told)."""
    return {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}


def client(url: str, *, socket_timeout: float, socket_connect_timeout: float) -> redis.Redis:
    """A client for ``url``: ``redis.Redis.from_url``, or for a ``sentinel://`` URL a client
    of the master its Sentinels name now, that asks them again after a failover (a
    connection to a demoted master fails with a connection error; the next one goes to the
    new master)."""
    if not is_sentinel(url):
        return redis.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout
        )
    target = parse_sentinel(url)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=sentinel_kwargs(socket_connect_timeout)
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.master,
        redis_class=redis.Redis,
        db=target.db,
        username=target.username,
        password=target.password,
        socket_timeout=socket_timeout,
        socket_connect_timeout=socket_connect_timeout,
    )
    return master
