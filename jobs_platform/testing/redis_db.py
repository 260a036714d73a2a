"""A Redis database of a test session's own, on a shared server or a private one.

Several test sessions (developers, CI jobs, other projects) may share one Redis server:
each claims an *empty* database number with a key and flushes it at the end, so no
session reads another's queues. Without a server to share, a private ``redis-server``
is started on a free loopback port.
"""

from __future__ import annotations

import contextlib
import shutil
import urllib.parse
import uuid
from collections.abc import Iterator

from jobs_platform.errors import ConfigError
from jobs_platform.testing.processes import RedisServer, port_answers
from jobs_platform.urls import masked

#: Set in the claimed database (the platform's own suite uses the same key).
CLAIM_KEY = "jobs-platform:test-session"
CLAIM_TTL_S = 3600
#: Database 0 is left alone: it is where an application's own default points.
DB_NUMBERS = range(15, 0, -1)
DEFAULT_SERVER = "redis://127.0.0.1:6379"
#: The configured value that asks for a private redis-server even when a shared one answers.
PRIVATE = "private"


def server_url(url: str) -> str:
    """``url`` without its database number: ``redis://h:6379/3`` -> ``redis://h:6379``."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        raise ConfigError(
            f"a test Redis must be a redis:// or rediss:// URL with a host, got {masked(url)!r}"
        )
    return urllib.parse.urlunsplit(parts._replace(path="", query="", fragment=""))


@contextlib.contextmanager
def claimed_database(server: str) -> Iterator[str]:
    """The URL of an empty database on ``server`` claimed for the caller; flushed at the end."""
    import redis

    base = server_url(server)
    token = uuid.uuid4().hex
    for db in DB_NUMBERS:
        client = redis.Redis.from_url(f"{base}/{db}")
        try:
            try:
                client.ping()
            except redis.ConnectionError as exc:
                raise ConfigError(
                    f"the test Redis at {masked(base)} does not answer: {exc}"
                ) from exc
            # Empty *and* claimed atomically: two sessions racing for one number, one wins.
            if client.dbsize() == 0 and client.set(CLAIM_KEY, token, nx=True, ex=CLAIM_TTL_S):
                try:
                    yield f"{base}/{db}"
                finally:
                    client.flushdb()
                return
        finally:
            client.close()
    raise ConfigError(
        f"no empty database (1-15) on the test Redis at {masked(base)}: other sessions hold "
        "them all, or something else writes there"
    )


@contextlib.contextmanager
def session_redis(configured: str | None) -> Iterator[str]:
    """A database for one test session, from ``configured`` (``JOBS_TEST_REDIS``):

    - a ``redis://`` URL: claim a database on that server (it must answer);
    - ``"private"``: start a private ``redis-server`` and use its database 0;
    - nothing: the server on 127.0.0.1:6379 if one answers, else a private one.
    """
    if configured and configured != PRIVATE:
        with claimed_database(configured) as url:
            yield url
        return
    if not configured and port_answers("127.0.0.1", 6379):
        with claimed_database(DEFAULT_SERVER) as url:
            yield url
        return
    if shutil.which("redis-server") is None:
        raise ConfigError(
            "no Redis for the tests: nothing answers on 127.0.0.1:6379 and redis-server is "
            "not installed; set JOBS_TEST_REDIS=redis://host:port to use a server you have"
        )
    with RedisServer() as server:
        yield server.url
