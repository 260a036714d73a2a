"""What a test folder may reach, checked: a connection or a program outside its promise fails
the test at once, saying where the test belongs (CONTRIBUTING.md, "Tests").

Three doors are watched: Python sockets (Redis, RabbitMQ, HTTP: ``socket.socket.connect``
and ``connect_ex``), SQLAlchemy's ``do_connect`` (libpq opens PostgreSQL's socket in C, out
of Python's sight) and ``subprocess.Popen`` (by the basename of argv[0]). What a child
process connects to is not seen.
"""

from __future__ import annotations

import contextlib
import fnmatch
import ipaddress
import os
import shlex
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, NoReturn

import pytest
import sqlalchemy as sa

SERVICE_PORTS = {
    5432: "PostgreSQL",
    6379: "Redis",
    26379: "Redis Sentinel",
    5672: "RabbitMQ",
    15672: "RabbitMQ management",
}
REDIS_PORTS = frozenset({6379, 26379})
RABBITMQ_PORTS = frozenset({5672, 15672})
#: Servers a test would start for itself, and package installs (root and network).
SERVER_PROGRAMS = ("redis-server", "redis-sentinel", "rabbitmq*")
INSTALL_PROGRAMS = ("apt", "apt-get")
SEE = "(see CONTRIBUTING.md, 'Tests')"
#: For an app whose broker a test never contacts: the Redis port on purpose, so that a
#: guarded folder's test that did contact it fails saying so.
NO_BROKER = "redis://127.0.0.1:6379/0"


class ServiceRefused(pytest.fail.Exception):
    """A test reached past its folder's promise.

    pytest's own failure, a BaseException, so that a broad ``except Exception`` in the code
    under test (a retry loop, a health check) cannot turn it into a pass.
    """


@dataclass(frozen=True)
class Policy:
    refused_ports: frozenset[int]
    loopback_only: bool
    refused_programs: tuple[str, ...]  # fnmatch patterns of argv[0]'s basename
    advice: str


ANY_SERVICE = frozenset(SERVICE_PORTS)

UNIT = Policy(
    refused_ports=ANY_SERVICE,
    loopback_only=True,
    refused_programs=SERVER_PROGRAMS + INSTALL_PROGRAMS,
    advice=(
        "unit tests need no service: move this test to tests/integration/redis/ (Redis), "
        "tests/integration/sql/ (PostgreSQL) or tests/integration/tools/ (installs a tool) " + SEE
    ),
)
# PostgreSQL may be on another host (JOBS_TEST_PG), so only Redis and RabbitMQ are refused.
SQL_ONLY = Policy(
    refused_ports=REDIS_PORTS | RABBITMQ_PORTS,
    loopback_only=False,
    refused_programs=SERVER_PROGRAMS,
    advice="tests/integration/sql/ needs no Redis or RabbitMQ: move this test to "
    "tests/integration/redis/ " + SEE,
)
TOOLS = Policy(
    refused_ports=ANY_SERVICE,
    loopback_only=False,
    refused_programs=SERVER_PROGRAMS,
    advice="tests/integration/tools/ needs no service: move this test to "
    "tests/integration/redis/ or tests/integration/sql/ " + SEE,
)


def is_loopback(host: str) -> bool:
    if host == "localhost" or host.startswith("/"):  # a Unix socket is local too
        return True
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False  # a name to resolve: DNS is the network
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def program_of(args: Any, shell: bool = False) -> str:
    """The basename of argv[0] (of the command line's first word under ``shell=True``)."""
    if isinstance(args, str | bytes | os.PathLike):
        text = os.fsdecode(args)
        try:
            words = shlex.split(text) if shell else [text]
        except ValueError:
            words = text.split()
    else:
        words = [os.fsdecode(arg) for arg in args]
    return PurePath(words[0]).name if words else ""


@dataclass
class Guard:
    policy: Policy
    refusals: list[str] = field(default_factory=list)

    def refuse(self, what: str) -> NoReturn:
        message = f"{what}: {self.policy.advice}"
        self.refusals.append(message)
        raise ServiceRefused(message)

    def check_address(self, host: str, port: int) -> None:
        if port in self.policy.refused_ports:
            name = SERVICE_PORTS.get(port, "a service")
            self.refuse(f"connection to {host}:{port} ({name})")
        if self.policy.loopback_only and not is_loopback(host):
            self.refuse(f"connection to {host}:{port} (not loopback)")

    def check_program(self, args: Any, shell: bool = False) -> None:
        program = program_of(args, shell)
        if any(fnmatch.fnmatch(program, pattern) for pattern in self.policy.refused_programs):
            self.refuse(f"running {program!r}")

    @contextlib.contextmanager
    def each_test(self) -> Iterator[Guard]:
        """Fails the test at its end if a refusal was swallowed (a thread, ``except
        BaseException``): the refusal is raised where it happens, but might not get out."""
        self.refusals.clear()
        yield self
        if self.refusals:
            pytest.fail("refused during this test:\n" + "\n".join(self.refusals), pytrace=False)


def _sql_connect(guard: Guard, dialect: Any, cparams: dict[str, Any]) -> None:
    if dialect.name == "sqlite":
        return
    port = int(str(cparams.get("port") or 5432).split(",")[0])
    for host in str(cparams.get("host") or "localhost").split(","):
        guard.check_address(host, port)


@contextlib.contextmanager
def guarding(policy: Policy) -> Iterator[Guard]:
    """Applies ``policy`` to every connection and subprocess until the block ends."""
    guard = Guard(policy)
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_popen_init = subprocess.Popen.__init__

    def check(sock: socket.socket, address: Any) -> None:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):  # AF_UNIX paths are local
            return
        try:
            guard.check_address(str(address[0]), int(address[1]))
        except ServiceRefused:
            sock.close()  # the caller's cleanup handles OSError, not this: no ResourceWarning
            raise

    def connect(sock: socket.socket, address: Any) -> None:
        check(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        check(sock, address)
        return real_connect_ex(sock, address)

    def popen_init(popen: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        guard.check_program(kwargs.get("executable") or args, bool(kwargs.get("shell")))
        real_popen_init(popen, args, *rest, **kwargs)

    def do_connect(dialect: Any, conn_rec: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        _sql_connect(guard, dialect, cparams)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", connect)
        patch.setattr(socket.socket, "connect_ex", connect_ex)
        patch.setattr(subprocess.Popen, "__init__", popen_init)
        sa.event.listen(sa.Engine, "do_connect", do_connect)
        try:
            yield guard
        finally:
            sa.event.remove(sa.Engine, "do_connect", do_connect)


def fixtures(policy: Policy) -> tuple[Any, Any]:
    """The two autouse fixtures a folder's conftest.py binds to enforce ``policy``:
    ``folder_guard, service_guard = guards.fixtures(guards.UNIT)``."""

    # Package scope: in place before any module fixture of the folder, gone after its last test.
    @pytest.fixture(scope="package", autouse=True, name="folder_guard")
    def folder_guard() -> Iterator[Guard]:
        with guarding(policy) as guard:
            yield guard

    @pytest.fixture(autouse=True, name="service_guard")
    def service_guard(folder_guard: Guard) -> Iterator[Guard]:
        with folder_guard.each_test() as guard:
            yield guard

    return folder_guard, service_guard


def refused_fixture(name: str, policy: Policy) -> NoReturn:
    """For a conftest that overrides a service fixture (``redis_url``, ``pg_url``, ...):
    session fixtures are set up before any guard of a folder could be in place."""
    raise ServiceRefused(f"fixture {name!r}: {policy.advice}")
