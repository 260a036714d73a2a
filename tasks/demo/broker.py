"""Which Redis the tour runs on, said as it is, and left as it was found.

- ``JOBS_BROKER_URL`` set and answering: the tour runs on that server, in an *empty*
  database it claims there (15 down to 1, as a test session does; database 0 and any
  database holding keys are left alone), flushed when the tour ends. Nothing of the
  tour's stays in the user's Redis, and nothing of theirs is touched.
- Not set: a private ``redis-server`` on a free loopback port, stopped at the end (a Redis
  that merely answers on 6379 may be the one an application uses for real). Without
  ``redis-server``, the Redis on 127.0.0.1:6379 if it answers, as above.
- Set and not answering: a private ``redis-server``, saying so.

The launching process chooses, then runs the tour in a child pointed at the choice (the
``tasks`` app reads its settings when it is imported), which reads it back with
:func:`from_env` for its report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import urllib.parse
from collections.abc import Iterator, Mapping

import redis

from jobs_platform.errors import ConfigError
from jobs_platform.testing import RedisServer, port_answers
from jobs_platform.testing.redis_db import claimed_database, server_url
from jobs_platform.urls import masked

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
#: Set in the child that runs the tour: the chosen broker, as JSON (:meth:`Broker.to_env`).
ENV = "JOBS_DEMO_BROKER"
#: Claims the tour's database on a shared server (a test session's key is another one).
CLAIM_KEY = "jobs-platform:demo"


@dataclasses.dataclass(frozen=True)
class Broker:
    """The Redis the tour's processes use, and what the report may say of it."""

    url: str
    #: A redis-server the demo started for itself (else a database claimed on the user's).
    private: bool
    #: Why this one, for the first line ("JOBS_BROKER_URL is not set", ...).
    why: str = ""

    def describe(self) -> str:
        """Which Redis, whose, and why this one, in words."""
        why = f" ({self.why})" if self.why else ""
        if self.private:
            return f"a private redis-server at {self.url}, started for the tour{why}"
        number = urllib.parse.urlsplit(self.url).path.lstrip("/")
        return (
            f"database {number} of the Redis at {masked(server_url(self.url))}{why}, empty "
            "when the tour began and claimed for it"
        )

    def fate(self) -> str:
        """What becomes of it when the tour ends."""
        if self.private:
            return "stopped at the end: nothing is written to any other Redis"
        return "flushed at the end: no other database there is read or written"

    def to_env(self) -> dict[str, str]:
        return {ENV: json.dumps(dataclasses.asdict(self))}


def from_env(environ: Mapping[str, str]) -> Broker | None:
    """The broker the launching process chose, in the child that runs the tour."""
    raw = environ.get(ENV)
    return None if not raw else Broker(**json.loads(raw))


def answers(url: str) -> bool:
    parts = urllib.parse.urlparse(url)
    if parts.scheme != "redis" or not port_answers(
        parts.hostname or "127.0.0.1", parts.port or 6379
    ):
        return False
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def choose(environ: Mapping[str, str]) -> Iterator[Broker]:
    """The tour's broker (module doc), set up for the whole tour and put back after it."""
    given = environ.get("JOBS_BROKER_URL") or None
    installed = shutil.which("redis-server") is not None
    shared = given or (None if installed else DEFAULT_BROKER)
    if shared is not None and answers(shared):
        with claimed_database(shared, claim_key=CLAIM_KEY, what="the Redis") as url:
            why = "from JOBS_BROKER_URL" if given else "redis-server is not installed"
            yield Broker(url, private=False, why=why)
        return
    if not installed:
        raise ConfigError(
            f"no Redis for the demo: nothing answers at {masked(shared or DEFAULT_BROKER)} "
            "and redis-server is not installed; install redis-server, or set "
            "JOBS_BROKER_URL to a Redis that answers"
        )
    why = f"nothing answers at {masked(given)}" if given else "JOBS_BROKER_URL is not set"
    with RedisServer() as server:
        yield Broker(server.url, private=True, why=why)
