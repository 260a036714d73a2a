"""A RabbitMQ virtual host of a test's own, on the machine's RabbitMQ, with no Docker.

Every RabbitMQ test runs in a vhost created for it and deleted after it (with every queue
and message in it), so tests never see each other's queues and the node itself is never
reset. The management plugin is not needed: ``rabbitmqctl`` does the work.

::

    with rabbitmq_vhost() as url:          # amqp://guest:guest@127.0.0.1:5672/jobs-test-1a2b3c
        app = create_app(broker_url=url, ...)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
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


def available() -> bool:
    """Whether ``rabbitmqctl`` is installed and the node answers."""
    try:
        rabbitmqctl("status", timeout_s=20)
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        return False
    return True


@contextlib.contextmanager
def rabbitmq_vhost(prefix: str = "jobs-test", *, node: str | None = None) -> Iterator[str]:
    """A new vhost with full permissions for the URL's user; yields its ``amqp://`` URL and
    deletes the vhost (queues, messages and all) on the way out."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    credentials, _, address = server().rpartition("@")
    user = credentials.split(":", 1)[0] or "guest"
    rabbitmqctl("add_vhost", name, node=node)
    try:
        rabbitmqctl("set_permissions", "-p", name, user, ".*", ".*", ".*", node=node)
        yield f"amqp://{credentials}@{address}/{name}"
    finally:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            rabbitmqctl("delete_vhost", name, node=node)


def list_queues(vhost: str, *columns: str, node: str | None = None) -> list[dict[str, str]]:
    """``rabbitmqctl list_queues -p VHOST COLUMNS`` as one dict per queue."""
    columns = columns or ("name", "type", "messages")
    out = rabbitmqctl("list_queues", "-p", vhost, "--no-table-headers", *columns, node=node)
    rows = []
    for line in out.splitlines():
        if line.strip():
            rows.append(dict(zip(columns, line.split("\t"), strict=False)))
    return rows
