"""Which broker the tour runs on, said as it is, and left as it was found.

The tour runs on Redis (the default) or on RabbitMQ (``--broker rabbitmq``, or
``JOBS_DEMO_BROKER=rabbitmq``; ``make demo BROKER=rabbitmq``). Either way it needs a Redis:
the broker itself, or on RabbitMQ the coordination Redis (locks, rate limits, beat, metric
sums, revoked ids, results). Which Redis:

- ``JOBS_BROKER_URL`` set and answering: the tour runs on that server, in an *empty*
  database it claims there (15 down to 1, as a test session does; database 0 and any
  database holding keys are left alone), flushed when the tour ends. Nothing of the
  tour's stays in the user's Redis, and nothing of theirs is touched.
- Not set: a private ``redis-server`` on a free loopback port, stopped at the end (a Redis
  that merely answers on 6379 may be the one an application uses for real). Without
  ``redis-server``, the Redis on 127.0.0.1:6379 if it answers, as above.
- Set and not answering: a private ``redis-server``, saying so.

On RabbitMQ the queues live in a vhost of the tour's own (``jobs-demo-XXXXXX``) on the
RabbitMQ at ``JOBS_DEMO_RABBITMQ`` (default ``guest:guest@127.0.0.1:5672``), made with
``rabbitmqctl add_vhost`` and deleted at the end with every queue and delayed message in it
(``--keep-vhost`` keeps it to look at, and the report says how to delete it).

The launching process chooses, then runs the tour in a child pointed at the choice (the
``tasks`` app reads its settings when it is imported), which reads it back with
:func:`from_env` for its report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import subprocess
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping

import redis

from jobs_platform.errors import ConfigError
from jobs_platform.testing import RedisServer, port_answers
from jobs_platform.testing.rabbitmq import rabbitmqctl
from jobs_platform.testing.redis_db import claimed_database, server_url
from jobs_platform.urls import masked

DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
#: Which broker the user asked for (``redis`` or ``rabbitmq``): ``--broker`` defaults to it.
KIND_ENV = "JOBS_DEMO_BROKER"
KINDS = ("redis", "rabbitmq")
#: The RabbitMQ the tour makes its vhost on: ``user:password@host:port``.
RABBITMQ_ENV = "JOBS_DEMO_RABBITMQ"
DEFAULT_RABBITMQ = "guest:guest@127.0.0.1:5672"
#: Set in the child that runs the tour: the chosen broker, as JSON (:meth:`Broker.to_env`).
ENV = "JOBS_DEMO_CHOSEN_BROKER"
#: Claims the tour's database on a shared server (a test session's key is another one).
CLAIM_KEY = "jobs-platform:demo"


@dataclasses.dataclass(frozen=True)
class Broker:
    """The broker the tour's processes use (and its Redis), and what the report may say."""

    #: The tour's Redis: the broker on Redis, the coordination Redis on RabbitMQ.
    url: str
    #: A redis-server the demo started for itself (else a database claimed on the user's).
    private: bool
    #: Why this Redis, for the first line ("JOBS_BROKER_URL is not set", ...).
    why: str = ""
    #: ``redis`` or ``rabbitmq``.
    kind: str = "redis"
    #: On RabbitMQ: the broker URL (the tour's vhost), and whether the vhost is kept.
    amqp_url: str = ""
    keep_vhost: bool = False

    @property
    def rabbitmq(self) -> bool:
        return self.kind == "rabbitmq"

    @property
    def broker_url(self) -> str:
        """``JOBS_BROKER_URL`` for the tour's processes."""
        return self.amqp_url if self.rabbitmq else self.url

    @property
    def vhost(self) -> str:
        return urllib.parse.unquote(urllib.parse.urlsplit(self.amqp_url).path.lstrip("/"))

    @property
    def name(self) -> str:
        return "RabbitMQ" if self.rabbitmq else "Redis"

    def describe(self) -> str:
        """Which broker and Redis, whose, and why this one, in words."""
        redis_ = self.describe_redis()
        if not self.rabbitmq:
            return redis_
        address = urllib.parse.urlsplit(self.amqp_url).netloc.rpartition("@")[2]
        return (
            f"RabbitMQ at {address}, vhost {self.vhost} made for the tour with rabbitmqctl "
            f"(quorum queues); coordination and results on {redis_}"
        )

    def describe_redis(self) -> str:
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
            redis_ = "stopped at the end: nothing is written to any other Redis"
        else:
            redis_ = "flushed at the end: no other database there is read or written"
        if not self.rabbitmq:
            return redis_
        if self.keep_vhost:
            vhost = (
                f"the vhost {self.vhost} is kept (--keep-vhost): look with `rabbitmqctl "
                f"list_queues -p {self.vhost}`, delete with `rabbitmqctl delete_vhost "
                f"{self.vhost}`"
            )
        else:
            vhost = f"the vhost {self.vhost} deleted at the end, with every queue and message"
        return f"{vhost}; the Redis {redis_}"

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


def kind_of(value: str) -> str:
    """``--broker`` / ``JOBS_DEMO_BROKER``: redis (also empty) or rabbitmq."""
    kind = (value or "redis").strip().lower()
    if kind not in KINDS:
        raise ConfigError(f"{KIND_ENV} / --broker is redis or rabbitmq, not {value!r}")
    return kind


@contextlib.contextmanager
def choose(
    environ: Mapping[str, str], *, kind: str = "redis", keep_vhost: bool = False
) -> Iterator[Broker]:
    """The tour's broker (module doc), set up for the whole tour and put back after it."""
    with choose_redis(environ, rabbitmq=kind == "rabbitmq") as chosen:
        if kind != "rabbitmq":
            yield chosen
            return
        with rabbitmq_vhost(environ, keep=keep_vhost) as amqp_url:
            yield dataclasses.replace(
                chosen, kind="rabbitmq", amqp_url=amqp_url, keep_vhost=keep_vhost
            )


@contextlib.contextmanager
def rabbitmq_vhost(environ: Mapping[str, str], *, keep: bool) -> Iterator[str]:
    """A vhost of the tour's own on the RabbitMQ at ``JOBS_DEMO_RABBITMQ``, its URL; deleted
    at the end unless ``keep``."""
    server = environ.get(RABBITMQ_ENV) or DEFAULT_RABBITMQ
    credentials, _, address = server.rpartition("@")
    host, _, port = address.partition(":")
    user = credentials.split(":", 1)[0] or "guest"
    if not port_answers(host or "127.0.0.1", int(port or 5672)):
        raise ConfigError(
            f"no RabbitMQ for the demo: nothing answers at {address} ({RABBITMQ_ENV}); start "
            "rabbitmq-server, or run the tour on Redis (without BROKER=rabbitmq)"
        )
    if shutil.which("rabbitmqctl") is None:
        raise ConfigError(
            "the demo makes a vhost of its own with rabbitmqctl, which is not installed"
        )
    vhost = f"jobs-demo-{uuid.uuid4().hex[:6]}"
    try:
        rabbitmqctl("add_vhost", vhost)
        rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
            rabbitmqctl("delete_vhost", vhost)
        raise ConfigError(f"could not make the demo's vhost with rabbitmqctl: {exc}") from None
    try:
        yield f"amqp://{credentials}@{address}/{vhost}"
    finally:
        if not keep:
            with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
                rabbitmqctl("delete_vhost", vhost)


@contextlib.contextmanager
def choose_redis(environ: Mapping[str, str], *, rabbitmq: bool = False) -> Iterator[Broker]:
    """The tour's Redis (module doc). On RabbitMQ an ``amqp://`` JOBS_BROKER_URL names no
    Redis; JOBS_COORDINATION_URL may."""
    source = "JOBS_BROKER_URL"
    given = environ.get(source) or None
    if rabbitmq:
        if environ.get("JOBS_COORDINATION_URL"):
            source = "JOBS_COORDINATION_URL"
            given = environ[source]
        if given and not given.startswith("redis"):
            given = None
    installed = shutil.which("redis-server") is not None
    shared = given or (None if installed else DEFAULT_BROKER)
    if shared is not None and answers(shared):
        with claimed_database(shared, claim_key=CLAIM_KEY, what="the Redis") as url:
            why = f"from {source}" if given else "redis-server is not installed"
            yield Broker(url, private=False, why=why)
        return
    if not installed:
        raise ConfigError(
            f"no Redis for the demo: nothing answers at {masked(shared or DEFAULT_BROKER)} "
            "and redis-server is not installed; install redis-server, or set "
            "JOBS_BROKER_URL to a Redis that answers"
        )
    why = f"nothing answers at {masked(given)}" if given else f"{source} is not set"
    with RedisServer() as server:
        yield Broker(server.url, private=True, why=why)
