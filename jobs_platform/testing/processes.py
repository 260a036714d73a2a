"""Real processes for tests, with no Docker: ``celery worker``, a private redis-server, polling.

pytest-celery's fixtures start Docker containers; these run the same kind of checks
against services on this machine. Every helper cleans up what it started.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | bool | None],
    *,
    timeout_s: float,
    interval_s: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value; fail with ``message`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value  # type: ignore[return-value]
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {text}")
        time.sleep(interval_s)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_answers(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


class RedisServer:
    """A private ``redis-server`` on a free loopback port (optionally persistent)."""

    def __init__(
        self,
        *,
        persistent: bool = False,
        directory: str | None = None,
        args: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        self.port = port or free_port()
        self.persistent = persistent
        #: More ``redis-server`` arguments (``--replicaof 127.0.0.1 PORT``, ...).
        self.args = list(args)
        self._owned_dir = directory is None
        self.directory = directory or tempfile.mkdtemp(prefix="jobs-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.persistent
            else ["--save", "", "--appendonly", "no"]
        )
        self.process = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--dir",
                self.directory,
                *persistence,
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        wait_for(
            lambda: port_answers("127.0.0.1", self.port),
            timeout_s=10,
            message=f"redis-server on port {self.port}",
        )
        return self

    def kill(self) -> None:
        """SIGKILL the server: no shutdown save, no goodbye to its replicas or clients."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def close(self) -> None:
        self.stop()
        if self._owned_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Every worker started and not yet stopped: killed at interpreter exit as a safety net, so a
#: failing test can never leave a worker behind to consume a later test's messages.
_LIVE: set[WorkerProcess] = set()


@atexit.register
def _kill_leftover_workers() -> None:
    for proc in list(_LIVE):
        proc.kill()


class WorkerProcess:
    """A real ``celery worker`` subprocess in its own process group, so it can be killed.

    Readiness is read from the worker's own log ("<hostname> ready."), so no broker round
    trip is needed and a worker that refuses to start fails fast with its log attached.
    """

    def __init__(
        self,
        app: str,
        queues: Sequence[str],
        *,
        pool: str = "prefork",
        concurrency: int = 1,
        env: Mapping[str, str] | None = None,
        hostname: str | None = None,
        extra_args: Sequence[str] = (),
        cwd: str | os.PathLike[str] | None = None,
        log_dir: str | None = None,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.app = app
        self._argv = list(argv) if argv is not None else None
        self.queues = list(queues)
        self.pool = pool
        self.concurrency = concurrency
        self.hostname = hostname or f"w{uuid.uuid4().hex[:8]}@{'-'.join(self.queues)}"
        self.env = {**os.environ, **(env or {})}
        self.extra_args = list(extra_args)
        self.cwd = cwd
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"{self.hostname}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def for_profile(
        cls,
        app: str,
        queue: str,
        *,
        concurrency: int | None = None,
        hostname: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_dir: str | None = None,
    ) -> WorkerProcess:
        """A worker started exactly as ``worker-profile QUEUE [-c N] [options]`` starts it
        (docs/operations.md): ``concurrency`` defaults to the profile's."""
        from jobs_platform.profiles import PROFILES, worker_argv

        hostname = hostname or f"{queue}-{uuid.uuid4().hex[:6]}@demo"
        command = worker_argv(
            app, queue, hostname=hostname, concurrency=concurrency, extra=extra_args
        )
        return cls(
            app,
            [queue],
            pool=PROFILES[queue].pool,
            concurrency=concurrency or PROFILES[queue].concurrency,
            hostname=hostname,
            extra_args=extra_args,
            env=env,
            cwd=cwd,
            log_dir=log_dir,
            argv=[sys.executable, "-m", *command],
        )

    def argv(self) -> list[str]:
        if self._argv is not None:
            return self._argv
        from jobs_platform.profiles import celery_worker_argv

        return [
            sys.executable,
            "-m",
            *celery_worker_argv(
                self.app,
                self.queues,
                pool=self.pool,
                concurrency=self.concurrency,
                prefetch_multiplier=1,
                hostname=self.hostname,
                extra=self.extra_args,
            ),
        ]

    def start(self, *, wait: bool = True, timeout_s: float = 60) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            self.argv(),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
        )
        _LIVE.add(self)
        log.close()
        if wait:
            self.wait_ready(timeout_s)
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout_s: float = 60) -> None:
        def ready() -> bool:
            if f"{self.hostname} ready." in self.log():
                return True  # even if it has exited since (a job may end its own worker)
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"worker {self.hostname} exited with {self.process.returncode}:\n"
                    f"{self.log()[-4000:]}"
                )
            return f"{self.hostname} ready." in self.log()

        wait_for(
            ready,
            timeout_s=timeout_s,
            message=lambda: f"worker {self.hostname} to be ready:\n{self.log()[-2000:]}",
        )

    def wait_exit(self, timeout_s: float = 60) -> int:
        assert self.process is not None
        return self.process.wait(timeout_s)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to the main process (as ``docker stop`` or systemd do), or to the
        whole group (main process and pool children) with ``group=True``."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if group:
                    os.killpg(self.process.pid, signum)
                else:
                    self.process.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL the whole worker: no chance to ack, requeue or say goodbye."""
        self.signal(signal.SIGKILL, group=True)
        if self.process is not None:
            self.process.wait(30)
        _LIVE.discard(self)

    def stop(self, timeout_s: float = 20) -> None:
        """Warm shutdown (SIGTERM to the main process), then SIGKILL at the deadline."""
        if self.process is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
        # Orphaned pool children, if any, go with the group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        _LIVE.discard(self)

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def workers(*procs: WorkerProcess) -> Iterator[tuple[WorkerProcess, ...]]:
    """Start several workers concurrently and stop them all at the end."""
    try:
        for proc in procs:
            proc.start(wait=False)
        for proc in procs:
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs:
            proc.stop()
