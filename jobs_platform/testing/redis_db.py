"""A Redis database of a test session's own, on a private server or a shared one.

By default a session starts a private ``redis-server`` on a free loopback port: a Redis
that answers on 127.0.0.1:6379 may be the one the application uses for real, so the tests
take a shared server only when they are given one (``JOBS_TEST_REDIS``). There, several
sessions (developers, CI jobs, other projects) share it: each claims an *empty* database
number with a key and flushes it at the end, so no session reads another's queues.
"""

from __future__ import annotations

import contextlib
import shutil
import urllib.parse
import uuid
from collections.abc import Iterator

from jobs_platform.errors import ConfigError
from jobs_platform.testing.processes import RedisServer
from jobs_platform.urls import masked

#: Set in the claimed database (the platform's own suite uses the same key).
CLAIM_KEY = "jobs-platform:test-session"
CLAIM_TTL_S = 3600
#: Database 0 is left alone: it is where an application's own default points.
DB_NUMBERS = range(15, 0, -1)
#: The configured value that asks for a private redis-server (also the default).
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
def claimed_database(
    server: str, *, claim_key: str = CLAIM_KEY, what: str = "the test Redis"
) -> Iterator[str]:
    """The URL of an empty database on ``server`` claimed for the caller (with
    ``claim_key``); flushed at the end. ``what`` names the server in errors."""
    import redis

    base = server_url(server)
    token = uuid.uuid4().hex
    for db in DB_NUMBERS:
        client = redis.Redis.from_url(f"{base}/{db}")
        try:
            try:
                client.ping()
            except redis.ConnectionError as exc:
                raise ConfigError(f"{what} at {masked(base)} does not answer: {exc}") from exc
            # Empty *and* claimed atomically: two sessions racing for one number, one wins.
            if client.dbsize() == 0 and client.set(claim_key, token, nx=True, ex=CLAIM_TTL_S):
                try:
                    yield f"{base}/{db}"
                finally:
                    client.flushdb()
                return
        finally:
            client.close()
    raise ConfigError(
        f"no empty database (1-15) on {what} at {masked(base)}: other sessions hold "
        "them all, or something else writes there"
    )


@contextlib.contextmanager
def session_redis(configured: str | None) -> Iterator[str]:
    """A database for one test session, from ``configured`` (``JOBS_TEST_REDIS``):

    - a ``redis://`` URL: claim a database on that server (it must answer);
    - ``"private"`` or nothing: start a private ``redis-server`` and use its database 0
      (refused, saying what to do, when redis-server is not installed: a Redis that merely
      answers on 6379 is never taken without being named).
    """
    if configured and configured != PRIVATE:
        with claimed_database(configured) as url:
            yield url
        return
    if shutil.which("redis-server") is None:
        raise ConfigError(
            "no Redis for the tests: redis-server is not installed, and the tests use no "
            "Redis they were not given (the one on 127.0.0.1:6379 may hold your app's real "
            "data). Install redis-server (a private one is started on a free loopback port "
            "and stopped at the end), or set JOBS_TEST_REDIS=redis://host:port to use a "
            "server of your choice (an empty database there, 15 down to 1, is claimed and "
            "flushed at the end)"
        )
    with RedisServer() as server:
        yield server.url
