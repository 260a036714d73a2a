"""A private Redis Sentinel deployment for tests: a master, its replicas and a quorum of
Sentinels, each a ``redis-server`` on a free loopback port, started and stopped together.

::

    with SentinelSet(replicas=1, sentinels=3) as deployment:
        url = deployment.url(db=0)      # sentinel://127.0.0.1:P1/0;...#jobsmaster
        old = deployment.kill_master()  # SIGKILL the master
        new, took_s = deployment.wait_failover(old)

``redis-server --sentinel`` runs a Sentinel (no separate binary). Nothing here touches any
other Redis on the machine; everything started is stopped (and its directory removed) on
the way out, a failing test included.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from jobs_platform.testing.processes import RedisServer, free_port, port_answers, wait_for

HOST = "127.0.0.1"


class SentinelProcess:
    """One ``redis-server --sentinel`` with a config file of its own (Sentinel rewrites it)."""

    def __init__(
        self,
        directory: Path,
        master_name: str,
        master_port: int,
        quorum: int,
        *,
        down_after_ms: int,
        failover_timeout_ms: int,
    ) -> None:
        self.port = free_port()
        self.directory = directory
        self.config = directory / "sentinel.conf"
        self.config.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    f"bind {HOST}",
                    f"dir {directory}",
                    f"sentinel monitor {master_name} {HOST} {master_port} {quorum}",
                    f"sentinel down-after-milliseconds {master_name} {down_after_ms}",
                    f"sentinel failover-timeout {master_name} {failover_timeout_ms}",
                    f"sentinel parallel-syncs {master_name} 1",
                    "",
                ]
            )
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        log = (self.directory / "sentinel.log").open("wb")
        self.process = subprocess.Popen(
            [binary, str(self.config), "--sentinel"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def client(self) -> redis.Redis:
        return redis.Redis(HOST, self.port, socket_timeout=2, socket_connect_timeout=2)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None


class SentinelSet:
    """A master, ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority) on
    loopback (module doc). ``down_after_ms`` and ``failover_timeout_ms`` are the Sentinels'
    ``down-after-milliseconds`` and ``failover-timeout``; ``server_args`` go to every data
    node (``--min-replicas-to-write 1``...), which any of them may be master of later."""

    def __init__(
        self,
        *,
        master_name: str = "jobsmaster",
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        server_args: Sequence[str] = (),
    ) -> None:
        self.master_name = master_name
        self.directory = Path(tempfile.mkdtemp(prefix="jobs-sentinel-"))
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        first = RedisServer(directory=self._dir("node-0"), args=server_args)
        self.servers = [first] + [
            RedisServer(
                directory=self._dir(f"node-{n}"),
                args=[*server_args, "--replicaof", HOST, str(first.port)],
            )
            for n in range(1, replicas + 1)
        ]
        quorum = sentinels // 2 + 1
        self.sentinels = [
            SentinelProcess(
                Path(self._dir(f"sentinel-{n}")),
                master_name,
                first.port,
                quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
            )
            for n in range(sentinels)
        ]

    def _dir(self, name: str) -> str:
        path = self.directory / name
        path.mkdir()
        return str(path)

    # -- URLs --------------------------------------------------------------------------------

    def url(self, db: int = 0, *, password: str | None = None) -> str:
        """The platform's URL of the master: every Sentinel, the master's name as fragment."""
        auth = f":{password}@" if password else ""
        entries = [f"sentinel://{auth}{HOST}:{s.port}/{db}" for s in self.sentinels]
        return ";".join(entries) + f"#{self.master_name}"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, timeout_s: float = 30) -> SentinelSet:
        try:
            for server in self.servers:
                server.start()
            wait_for(self._replicas_linked, timeout_s=timeout_s, message="replicas in sync")
            for sentinel in self.sentinels:
                sentinel.start()
            for sentinel in self.sentinels:
                wait_for(
                    lambda s=sentinel: port_answers(HOST, s.port),  # type: ignore[misc]
                    timeout_s=10,
                    message=f"sentinel on port {sentinel.port}",
                )
            wait_for(
                self._sentinels_see_everyone,
                timeout_s=timeout_s,
                interval_s=0.2,
                message="every sentinel to see the master, its replicas and the others",
            )
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------------

    def server_on(self, port: int) -> RedisServer:
        return next(server for server in self.servers if server.port == port)

    def master_port(self) -> int | None:
        """The master's port as a majority of the live Sentinels say it (None: no majority)."""
        said: dict[int, int] = {}
        for sentinel in self.sentinels:
            if not sentinel.alive:
                continue
            with contextlib.suppress(redis.RedisError):
                address = sentinel.client().sentinel_get_master_addr_by_name(self.master_name)
                if isinstance(address, tuple | list) and address:
                    said[int(address[1])] = said.get(int(address[1]), 0) + 1
        best = max(said.items(), key=lambda item: item[1], default=None)
        return best[0] if best and best[1] > len(self.sentinels) // 2 else None

    def role(self, port: int) -> str | None:
        try:
            info = redis.Redis(HOST, port, socket_timeout=1, socket_connect_timeout=1).info(
                "replication"
            )
        except redis.RedisError:
            return None
        return str(info.get("role"))

    def _replicas_linked(self) -> bool:
        master = redis.Redis(HOST, self.servers[0].port, socket_timeout=1)
        try:
            return (
                int(master.info("replication").get("connected_slaves", 0)) >= len(self.servers) - 1
            )
        except redis.RedisError:
            return False

    def _sentinels_see_everyone(self) -> bool:
        for sentinel in self.sentinels:
            try:
                state = sentinel.client().sentinel_master(self.master_name)
            except redis.RedisError:
                return False
            if not isinstance(state, dict):
                return False
            if int(state.get("num-slaves", 0)) < len(self.servers) - 1:
                return False
            if int(state.get("num-other-sentinels", 0)) < len(self.sentinels) - 1:
                return False
        return True

    # -- faults ------------------------------------------------------------------------------

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master; the server killed."""
        port = self.master_port()
        if port is None:
            raise RuntimeError("the sentinels do not agree on a master")
        server = self.server_on(port)
        server.kill()
        return server

    def failover(self) -> None:
        """A graceful failover (``SENTINEL FAILOVER``): the master is demoted, not killed."""
        client = self.sentinels[0].client()
        client.execute_command("SENTINEL", "FAILOVER", self.master_name)  # type: ignore[no-untyped-call]

    def wait_failover(self, old: RedisServer, timeout_s: float = 60) -> tuple[RedisServer, float]:
        """Wait until a majority of the Sentinels name another master that says it is one;
        that server and the seconds waited."""
        start = time.monotonic()

        def promoted() -> int | None:
            port = self.master_port()
            if port is None or port == old.port or self.role(port) != "master":
                return None
            return port

        port = wait_for(promoted, timeout_s=timeout_s, interval_s=0.05, message="a failover")
        return self.server_on(port), time.monotonic() - start
