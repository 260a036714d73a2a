"""A RabbitMQ virtual host of a test's own, on the machine's RabbitMQ, with no Docker.

Every RabbitMQ test runs in a vhost created for it and deleted after it (with every queue
and message in it), so tests never see each other's queues and the node itself is never
reset. The management plugin is not needed: ``rabbitmqctl`` does the work. Each
``rabbitmqctl`` call boots an Erlang VM (~2 s), and three per vhost made vhosts the bulk of
the RabbitMQ tests' time: so vhosts are created :data:`BATCH` at a time in one call, each
handed to one test only, and the used ones deleted together in one call (when
:data:`BATCH` have piled up, at :func:`flush` and at interpreter exit).

::

    with rabbitmq_vhost() as url:          # amqp://guest:guest@127.0.0.1:5672/jobs-test-1a2b3c
        app = create_app(broker_url=url, ...)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator

#: The machine's RabbitMQ (``JOBS_TEST_RABBITMQ`` points elsewhere): host:port, user, password.
DEFAULT_SERVER = "guest:guest@127.0.0.1:5672"


def server() -> str:
    return os.environ.get("JOBS_TEST_RABBITMQ", DEFAULT_SERVER)


def rabbitmqctl(*args: str, node: str | None = None, timeout_s: float = 60.0) -> str:
    """Run ``rabbitmqctl -q [-n NODE] ARGS``; its output, or RuntimeError with its stderr."""
    command = [shutil.which("rabbitmqctl") or "rabbitmqctl", "-q"]
    if node:
        command += ["-n", node]
    done = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip() or done.stdout}")
    return done.stdout


_AVAILABLE: dict[str | None, bool] = {}


def available(node: str | None = None) -> bool:
    """Whether ``rabbitmqctl`` is installed and the node answers (asked once per process)."""
    if node not in _AVAILABLE:
        try:
            rabbitmqctl("status", node=node, timeout_s=20)
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            _AVAILABLE[node] = False
        else:
            _AVAILABLE[node] = True
    return _AVAILABLE[node]


#: Vhosts made, and deleted, per ``rabbitmqctl`` call.
BATCH = 8
#: Who the node's logs say made or deleted the vhosts.
_ACTOR = "jobs-platform-tests"


def _erlang_list(names: list[str]) -> str:
    return "[" + ", ".join(f'<<"{name}">>' for name in names) + "]"


def _create(names: list[str], user: str, node: str | None) -> None:
    rabbitmqctl(
        "eval",
        f'[begin rabbit_vhost:add(V, <<"{_ACTOR}">>), '
        f'rabbit_auth_backend_internal:set_permissions(<<"{user}">>, V, '
        f'<<".*">>, <<".*">>, <<".*">>, <<"{_ACTOR}">>) end '
        f"|| V <- {_erlang_list(names)}], ok.",
        node=node,
    )


def _delete(names: list[str], node: str | None) -> None:
    rabbitmqctl(
        "eval",
        f'[rabbit_vhost:delete(V, <<"{_ACTOR}">>) || V <- {_erlang_list(names)}], ok.',
        node=node,
    )


class _Vhosts:
    """Fresh vhosts made ahead in batches; used ones deleted in batches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fresh: dict[tuple[str | None, str, str], list[str]] = {}
        self._used: dict[str | None, list[str]] = {}

    def take(self, prefix: str, user: str, node: str | None) -> str:
        key = (node, prefix, user)
        with self._lock:
            fresh = self._fresh.setdefault(key, [])
            if not fresh:
                names = [f"{prefix}-{uuid.uuid4().hex[:8]}" for _ in range(BATCH)]
                _create(names, user, node)
                fresh.extend(names)
            return fresh.pop()

    def give_back(self, name: str, node: str | None) -> None:
        with self._lock:
            used = self._used.setdefault(node, [])
            used.append(name)
            if len(used) >= BATCH:
                self._flush(node)

    def flush(self) -> None:
        """Delete every used vhost now, and every fresh one (at exit)."""
        with self._lock:
            for node in list(self._used):
                self._flush(node)

    def close(self) -> None:
        with self._lock:
            for (node, _prefix, _user), fresh in self._fresh.items():
                self._used.setdefault(node, []).extend(fresh)
                fresh.clear()
            for node in list(self._used):
                self._flush(node)

    def _flush(self, node: str | None) -> None:
        names, self._used[node] = self._used.get(node, []), []
        if names:
            with contextlib.suppress(RuntimeError, OSError, subprocess.TimeoutExpired):
                _delete(names, node)


_VHOSTS = _Vhosts()
atexit.register(_VHOSTS.close)


def flush() -> None:
    """Delete the vhosts tests have finished with now (they go in batches otherwise)."""
    _VHOSTS.flush()


@contextlib.contextmanager
def rabbitmq_vhost(prefix: str = "jobs-test", *, node: str | None = None) -> Iterator[str]:
    """A new vhost with full permissions for the URL's user, never used before; yields its
    ``amqp://`` URL. On the way out the vhost is doomed: deleted (queues, messages, open
    connections and all) with the next batch, at :func:`flush` or at exit."""
    credentials, _, address = server().rpartition("@")
    user = credentials.split(":", 1)[0] or "guest"
    name = _VHOSTS.take(prefix, user, node)
    try:
        yield f"amqp://{credentials}@{address}/{name}"
    finally:
        _VHOSTS.give_back(name, node)


def list_queues(vhost: str, *columns: str, node: str | None = None) -> list[dict[str, str]]:
    """``rabbitmqctl list_queues -p VHOST COLUMNS`` as one dict per queue."""
    columns = columns or ("name", "type", "messages")
    out = rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", *columns, node=node)
    rows = []
    for line in out.splitlines():
        if line.strip():
            rows.append(dict(zip(columns, line.split("\t"), strict=False)))
    return rows
