"""Real worker processes against the real Redis broker (the session's own database), and,
for the tests that take the ``broker`` fixture, against RabbitMQ too (a vhost of the
module's own, the session's Redis database for coordination and results)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

from jobs_platform.testing import WorkerProcess, wait_for
from jobs_platform.testing import rabbitmq as rabbitmq_testing

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def worker_env(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    """The environment of worker processes, applied to this process too: apps created here
    (to dispatch and read results) must talk to the same isolated Redis database."""
    env = {
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": f"sqlite:///{tmp_path_factory.mktemp('db')}/jobs.sqlite3",
    }
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    yield {**env, "PYTHONPATH": str(ROOT)}
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def test_app(worker_env: dict[str, str]) -> Any:
    from tests.support import worker_app

    return worker_app


def make_worker(env: dict[str, str], queues: list[str], tmp: Path, **kwargs: Any) -> WorkerProcess:
    return WorkerProcess(
        "tests.support.worker_app", queues, env=env, cwd=str(ROOT), log_dir=str(tmp), **kwargs
    )


@pytest.fixture(scope="module")
def fast_worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory, test_app: Any
) -> Iterator[WorkerProcess]:
    """One prefork worker consuming fast and thirdparty (not heavy)."""
    with make_worker(
        worker_env, ["fast", "thirdparty"], tmp_path_factory.mktemp("w"), concurrency=2
    ) as worker:
        yield worker


def runs(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in client.lrange(f"jptest:runs:{key}", 0, -1)]


def wait_state(result: Any, states: set[str], timeout_s: float = 30) -> str:
    return str(
        wait_for(
            lambda: result.state if result.state in states else None,
            timeout_s=timeout_s,
            message=lambda: f"{result.id} in {states} (now {result.state})",
        )
    )


def copies_in_broker(client: redis.Redis, task_id: str) -> list[str]:
    """Where a message of ``task_id`` still exists: any queue list (priority sub-lists
    included) or the unacked hash (fetched, or held for a countdown, by some worker)."""
    found = []
    for key in client.scan_iter(count=1000):
        name = key.decode() if isinstance(key, bytes) else key
        kind = client.type(key)
        kind = kind.decode() if isinstance(kind, bytes) else kind
        if kind == "list" and not name.startswith("jptest:"):
            if any(task_id in str(item) for item in client.lrange(key, 0, -1)):
                found.append(name)
        elif (
            kind == "hash"
            and name == "unacked"
            and any(task_id in str(value) for value in client.hvals(key))
        ):
            found.append(name)
    return found


# -- both brokers -----------------------------------------------------------------------------

#: The ids of the ``broker`` fixture's params: ``test_x[redis]``, ``test_x[rabbitmq]``.
BROKERS = ("redis", "rabbitmq")


@contextlib.contextmanager
def environment(env: Mapping[str, str]) -> Iterator[None]:
    """``env`` applied to this process for the block (an app made inside reads it)."""
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclasses.dataclass(frozen=True)
class Broker:
    """The broker a parametrised test runs on, and how to reach what its jobs leave.

    ``env`` is the workers' environment. Tasks record runs (``jptest:*``), and the platform
    keeps locks, rate limits, the dead-letter spool and results, on ``coordination_url``:
    the session's Redis database on both brokers (on Redis it is also the broker).
    """

    name: str
    env: dict[str, str]
    coordination_url: str
    vhost: str | None = None

    @property
    def is_rabbitmq(self) -> bool:
        return self.name == "rabbitmq"

    def load(self, module: str, env: Mapping[str, str] | None = None) -> ModuleType:
        """The support module ``module`` with its app built for this broker, in this process.

        On Redis (with no ``env``) it is the module as imported with the session's
        environment. Otherwise a copy of its own, executed under ``env`` (default: this
        broker's): reloading the shared module would switch a Redis test's app under it."""
        if not self.is_rabbitmq and env is None:
            return importlib.import_module(module)
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        copy = importlib.util.spec_from_file_location(
            f"{module}_{self.name}_{uuid.uuid4().hex[:6]}", spec.origin
        )
        assert copy is not None and copy.loader is not None
        loaded = importlib.util.module_from_spec(copy)
        with environment(self.env if env is None else env):
            copy.loader.exec_module(loaded)
        return loaded

    def close_connections(self) -> None:
        """Close every client connection to this broker's vhost (RabbitMQ only): what a
        network cut, a load balancer's idle timeout or a node's restart does to a worker."""
        assert self.vhost is not None, "close_connections is for the RabbitMQ broker"
        rabbitmq_testing.rabbitmqctl(
            "close_all_connections", "-p", self.vhost, "jobs-platform test: connection loss"
        )


def rabbitmq_env(base: Mapping[str, str], amqp_url: str, coordination_url: str) -> dict[str, str]:
    return {**base, "JOBS_BROKER_URL": amqp_url, "JOBS_COORDINATION_URL": coordination_url}


@pytest.fixture(scope="module", params=BROKERS)
def broker(
    request: pytest.FixtureRequest, worker_env: dict[str, str], redis_url: str
) -> Iterator[Broker]:
    """Each test that takes it runs on Redis, then on RabbitMQ (grouped per module: a
    module's workers for one broker are started once)."""
    if request.param == "redis":
        yield Broker("redis", worker_env, redis_url)
        return
    if not rabbitmq_testing.available():
        pytest.skip("RabbitMQ does not answer (`rabbitmq-server -detached` starts it)")
    with rabbitmq_testing.rabbitmq_vhost() as url:
        yield Broker(
            "rabbitmq",
            rabbitmq_env(worker_env, url, redis_url),
            redis_url,
            vhost=url.rsplit("/", 1)[1],
        )


@pytest.fixture(scope="module")
def broker_app(broker: Broker) -> Any:
    """``tests.support.worker_app`` on the module's broker (``test_app`` on Redis)."""
    return broker.load("tests.support.worker_app")


@pytest.fixture(scope="module")
def broker_fast_worker(
    broker: Broker, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """``fast_worker`` on the module's broker: on Redis the module's own ``fast_worker``
    (shared with the Redis-only tests), on RabbitMQ one like it in the vhost."""
    if not broker.is_rabbitmq:
        yield request.getfixturevalue("fast_worker")
        return
    with make_worker(
        broker.env, ["fast", "thirdparty"], tmp_path_factory.mktemp("w"), concurrency=2
    ) as worker:
        yield worker


def left_in_broker(broker: Broker, client: redis.Redis, task_id: str) -> list[str]:
    """Where a copy of ``task_id`` is left: :func:`copies_in_broker` on Redis; on RabbitMQ
    (a queue cannot be searched without taking its messages) every queue of the vhost that
    holds a message, ready or unacknowledged: its tests run one at a time in the vhost."""
    if not broker.is_rabbitmq:
        return copies_in_broker(client, task_id)
    assert broker.vhost is not None
    rows = rabbitmq_testing.list_queues(broker.vhost, "name", "messages")
    return [f"{r['name']} ({r['messages']})" for r in rows if r.get("messages", "0") != "0"]
