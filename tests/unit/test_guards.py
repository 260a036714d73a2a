"""The guard of tests/unit (tests/support/guards.py): services, the network and server or
package programs are refused at once, with the way out; loopback servers of a test's own and
SQLite files are not."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from tests.support import guards

WAY_OUT = r"unit tests need no service: move this test to tests/integration/.*CONTRIBUTING\.md"


@pytest.fixture()
def provoked(service_guard: guards.Guard) -> Iterator[list[str]]:
    """The refusals this test provokes on purpose, cleared so that its end does not fail it."""
    yield service_guard.refusals
    service_guard.refusals.clear()


@pytest.mark.parametrize("port", [5432, 6379, 5672, 26379, 15672])
def test_a_service_port_is_refused_on_any_address(provoked: list[str], port: int) -> None:
    for host in ("127.0.0.1", "localhost"):
        with pytest.raises(guards.ServiceRefused, match=WAY_OUT):
            socket.create_connection((host, port), timeout=5)
    assert len(provoked) == 2 and f":{port} ({guards.SERVICE_PORTS[port]})" in provoked[0]


def test_the_network_is_refused(provoked: list[str]) -> None:
    # TEST-NET-1: routed nowhere, so without the guard this would hang until the timeout.
    with pytest.raises(guards.ServiceRefused, match=WAY_OUT):
        socket.create_connection(("192.0.2.1", 80), timeout=5)
    assert provoked == [f"connection to 192.0.2.1:80 (not loopback): {guards.UNIT.advice}"]


def test_a_client_library_cannot_swallow_the_refusal(provoked: list[str], tmp_path: Path) -> None:
    # redis-py turns OSError into ConnectionError and retries; the refusal gets through.
    with pytest.raises(guards.ServiceRefused, match=r"127\.0\.0\.1:6379 \(Redis\)"):
        redis.Redis(host="127.0.0.1", port=6379, socket_connect_timeout=1).ping()
    # libpq opens PostgreSQL's socket in C; SQLAlchemy's do_connect sees the address first.
    for url in (
        "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
        "postgresql+psycopg://postgres@/postgres",  # the Unix socket, default port
    ):
        with pytest.raises(guards.ServiceRefused, match=r":5432 \(PostgreSQL\)"):
            sa.create_engine(url).connect()
    assert len(provoked) == 3
    # A SQLite file is no service.
    with sa.create_engine(f"sqlite:///{tmp_path}/ok.sqlite3").connect() as conn:
        assert conn.execute(sa.text("select 1")).scalar() == 1


def test_a_loopback_server_of_the_tests_own_is_allowed(provoked: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def echo() -> None:
            peer, _ = server.accept()
            with peer:
                peer.sendall(peer.recv(16))

        thread = threading.Thread(target=echo)
        thread.start()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            client.sendall(b"ping")
            assert client.recv(16) == b"ping"
        thread.join(timeout=5)
    assert provoked == []


@pytest.mark.parametrize(
    ("args", "shell"),
    [
        # Harmless arguments: were the guard broken, nothing would be installed or started.
        (["apt-get", "--version"], False),
        (["/usr/bin/redis-server", "--version"], False),
        (["/nonexistent/rabbitmq-plugins", "list"], False),
        ("rabbitmqctl --help | head -1", True),
    ],
)
def test_servers_and_package_installs_are_refused(
    provoked: list[str], args: list[str] | str, shell: bool
) -> None:
    with pytest.raises(guards.ServiceRefused, match=WAY_OUT):
        subprocess.run(args, shell=shell, capture_output=True, check=False, timeout=30)
    assert len(provoked) == 1 and provoked[0].startswith("running ")


def test_other_programs_run(provoked: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "print('ok')"], capture_output=True, text=True, check=True
    )
    assert done.stdout == "ok\n" and provoked == []


def test_the_service_fixtures_are_refused_by_name(
    provoked: list[str], request: pytest.FixtureRequest
) -> None:
    for name in ("redis_url", "pg_url", "module_pg_url"):
        with pytest.raises(guards.ServiceRefused, match=f"fixture '{name}': " + WAY_OUT):
            request.getfixturevalue(name)


def test_a_swallowed_refusal_still_fails_the_test_at_its_end() -> None:
    with (
        guards.guarding(guards.UNIT) as guard,
        pytest.raises(pytest.fail.Exception, match=r"refused during this test:\n.*6379"),
        guard.each_test(),
        contextlib.suppress(BaseException),  # what careless code under test might do
    ):
        socket.create_connection(("127.0.0.1", 6379), timeout=5)


@pytest.mark.parametrize(
    ("policy", "host", "port", "refused"),
    [
        (guards.UNIT, "::1", 8080, False),
        (guards.UNIT, "::ffff:127.0.0.1", 8080, False),
        (guards.UNIT, "/run/postgresql", 5433, False),
        (guards.UNIT, "10.0.0.7", 8080, True),
        (guards.UNIT, "example.com", 443, True),
        # tests/integration/sql: PostgreSQL anywhere (JOBS_TEST_PG), never Redis or RabbitMQ.
        (guards.SQL_ONLY, "db.example.com", 5432, False),
        (guards.SQL_ONLY, "127.0.0.1", 6379, True),
        (guards.SQL_ONLY, "127.0.0.1", 26379, True),
        (guards.SQL_ONLY, "127.0.0.1", 5672, True),
        (guards.TOOLS, "127.0.0.1", 5432, True),
    ],
)
def test_each_folders_policy(policy: guards.Policy, host: str, port: int, refused: bool) -> None:
    guard = guards.Guard(policy)
    with pytest.raises(guards.ServiceRefused) if refused else contextlib.nullcontext():
        guard.check_address(host, port)
    assert bool(guard.refusals) == refused


def test_the_sql_folder_refuses_starting_a_redis_server() -> None:
    guard = guards.Guard(guards.SQL_ONLY)
    with pytest.raises(guards.ServiceRefused, match="move this test to tests/integration/redis/"):
        guard.check_program(["redis-server", "--port", "0"])
    guard.check_program(["psql", "-c", "select 1"])
    assert len(guard.refusals) == 1
