"""A RabbitMQ cluster of a test's own on this machine (three nodes by default), with no Docker.

The machine's RabbitMQ node is never touched: each node here has its own node name (unique per
run), its own free loopback ports (AMQP and Erlang distribution), its own directory under a
temporary root (mnesia, logs, config) and a private Erlang cookie, so even a stray
``rabbitmqctl`` without the cookie cannot reach it. Only ``epmd`` (port 4369) is shared, as
every Erlang node on a host shares it (the first node starts it if it is not running, and it
stays, as it does for any Erlang node). Everything is stopped and deleted on the way out, even
when the test fails (and at interpreter exit as a safety net).

::

    with RabbitCluster() as cluster:                 # three nodes, joined
        urls = cluster.add_vhost("orders")           # urls.failover: "amqp://...;amqp://..."
        ...declare a quorum queue, publish...
        leader = cluster.leader_of("fast", "orders")
        cluster.kill(leader)                         # SIGKILL of that node's beam.smp
        ...consume through urls.failover...
        cluster.restart(leader, queue="fast", vhost="orders")
    print(cluster.timings)

Running a node needs ``rabbitmq-server`` installed and this process to be root (the node runs
as the ``rabbitmq`` user, as the packaged server does) or the ``rabbitmq`` user itself.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from jobs_platform.testing.processes import port_answers, wait_for
from jobs_platform.testing.rabbitmq import rabbitmqctl

#: The user a packaged RabbitMQ runs as; a root test process starts the nodes as this user.
RABBITMQ_USER = "rabbitmq"

#: Ports are drawn from here: below Linux's ephemeral range (32768+), so that no outgoing
#: connection takes one between the check and the node's bind, and away from 5672/25672.
_PORT_RANGE = (11000, 24999)

#: Every cluster started and not yet stopped: stopped at interpreter exit as a safety net.
_LIVE: set[RabbitCluster] = set()

#: The nodes' ``dead_letter_worker_publisher_confirm_timeout`` (RabbitMQ's default: 180 s).
DEAD_LETTER_CONFIRM_TIMEOUT_MS = 5000


@atexit.register
def _stop_leftover_clusters() -> None:
    for cluster in list(_LIVE):
        cluster.stop()


def server_script() -> Path | None:
    """The real ``rabbitmq-server`` script (not the Debian wrapper that ``su``'s to rabbitmq
    and hides the environment), or None when RabbitMQ is not installed."""
    found = shutil.which("rabbitmq-server")
    if found is None:
        return None
    # Debian's /usr/sbin/rabbitmq-server links to rabbitmq-script-wrapper; the script it
    # runs sits next to it. A generic-unix install's sbin/rabbitmq-server is itself.
    script = Path(os.path.realpath(found)).parent / "rabbitmq-server"
    return script if script.is_file() else None


def unavailable_reason() -> str | None:
    """Why a cluster cannot be started here (for ``pytest.skip``), or None when it can."""
    if server_script() is None or shutil.which("rabbitmqctl") is None:
        return "rabbitmq-server / rabbitmqctl are not installed"
    if os.geteuid() != 0:
        try:
            if pwd.getpwnam(RABBITMQ_USER).pw_uid != os.geteuid():
                return f"starting RabbitMQ nodes needs root or the {RABBITMQ_USER} user"
        except KeyError:
            return f"starting RabbitMQ nodes needs root or the {RABBITMQ_USER} user"
    return None


@dataclass
class ClusterNode:
    """One node: its Erlang node name, loopback ports and directory."""

    name: str  #: e.g. ``jt1-3fa9c2@localhost``
    amqp_port: int
    dist_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        """The node's console output (boot messages and crashes before logging starts)."""
        return self.directory / "console.log"

    def log_tail(self, chars: int = 3000) -> str:
        text = ""
        for path in (self.log_path, self.directory / "log" / f"{self.name}.log"):
            with contextlib.suppress(OSError):
                text += f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}\n"
        return text


@dataclass(frozen=True)
class ClusterUrls:
    """AMQP URLs of one vhost: each node's, and the ``;``-joined list Celery/kombu fail over
    along (``broker_url`` / ``JOBS_BROKER_URL``; kombu tries them in order, round-robin)."""

    nodes: Mapping[str, str]  #: node name → ``amqp://user:password@127.0.0.1:PORT/VHOST``

    @property
    def failover(self) -> str:
        return ";".join(self.nodes.values())

    def failover_from(self, first: str) -> str:
        """The list starting at node ``first`` (e.g. a dead one, to prove the client moves on)."""
        names = list(self.nodes)
        if first not in self.nodes:
            raise KeyError(f"no node {first!r} in {names}")
        at = names.index(first)
        return ";".join(self.nodes[name] for name in names[at:] + names[:at])


@dataclass
class ClusterTimings:
    """Wall-clock seconds measured by the harness."""

    start_s: float = 0.0  #: launch of all nodes until every one answered ``await_startup``
    join_s: float = 0.0  #: joining the others to the first until all run as one cluster
    restarts: list[tuple[str, float]] = field(default_factory=list)  #: (node, seconds) each
    stop_s: float = 0.0

    def __str__(self) -> str:
        restarts = ", ".join(f"{name.split('@')[0]} {s:.1f} s" for name, s in self.restarts)
        return (
            f"start {self.start_s:.1f} s, join {self.join_s:.1f} s, "
            f"restart [{restarts or '-'}], stop {self.stop_s:.1f} s"
        )


class RabbitCluster:
    """A RabbitMQ cluster of ``size`` nodes on loopback, started and joined by :meth:`start`
    (or ``with``), stopped and deleted by :meth:`stop`.

    Nodes are named ``{prefix}{i}-{run}@localhost`` with a random ``run``; user and password
    are the nodes' default ``guest``/``guest`` (usable from loopback only, as on any node).
    """

    def __init__(
        self,
        size: int = 3,
        *,
        prefix: str = "jt",
        user: str = "guest",
        password: str = "guest",
        boot_timeout_s: float = 120.0,
        directory: str | os.PathLike[str] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = size
        self.prefix = prefix
        self.user = user
        self.password = password
        self.boot_timeout_s = boot_timeout_s
        self.run = secrets.token_hex(3)
        self._parent = Path(directory) if directory is not None else None
        self.root: Path | None = None
        self.cookie = secrets.token_hex(16).upper()
        self.nodes: list[ClusterNode] = []
        self.timings = ClusterTimings()

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> RabbitCluster:
        """Start every node at once, wait until each has booted, then join the others to the
        first (``stop_app``, ``join_cluster``, ``start_app``). On failure everything started
        is stopped and the error carries the failing node's log."""
        reason = unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self.root = Path(tempfile.mkdtemp(prefix=f"jobs-rabbit-{self.run}-", dir=self._parent))
        _LIVE.add(self)
        try:
            ports = _free_ports(2 * self.size)
            for i in range(self.size):
                self.nodes.append(
                    self._prepare(i + 1, amqp_port=ports[2 * i], dist_port=ports[2 * i + 1])
                )
            self._chown(self.root)
            began = time.monotonic()
            for node in self.nodes:
                self._launch(node)
            deadline = began + self.boot_timeout_s
            for node in self.nodes:
                self._await_boot(node, deadline)
            self.timings.start_s = time.monotonic() - began
            began = time.monotonic()
            for node in self.nodes[1:]:
                # One at a time, as RabbitMQ's docs do (joining at once gained nothing on two
                # busy cores: each rabbitmqctl call is ~1 s of CLI start-up).
                self._join(node)
            wait_for(
                lambda: set(self.running_nodes()) == {n.name for n in self.nodes},
                timeout_s=60,
                interval_s=0.5,
                message=lambda: f"all of {[n.name for n in self.nodes]} running as one cluster",
            )
            self.timings.join_s = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop every node (SIGTERM: the node's own graceful shutdown), SIGKILL what is left at
        the deadline, and delete the directories. Safe to call twice."""
        began = time.monotonic()
        for node in self.nodes:
            for pid in self.beam_pids(node):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            wait_for(
                lambda: not any(self.beam_pids(n) for n in self.nodes),
                timeout_s=timeout_s,
                interval_s=0.2,
                message="the cluster's nodes to stop",
            )
        for node in self.nodes:
            # Whatever is left of the node (beam.smp, its shell wrapper, erl_child_setup,
            # inet_gethost) carries the node name in its environment.
            for pid in _pids_with_env("RABBITMQ_NODENAME", node.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._reap(node)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        if self in _LIVE:
            self.timings.stop_s = time.monotonic() - began
        _LIVE.discard(self)

    def __enter__(self) -> RabbitCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults -----------------------------------------------------------------------------

    def kill(self, node: str | ClusterNode) -> None:
        """SIGKILL the node's ``beam.smp``: no goodbye to its peers or clients (its TCP
        connections close, so peers see it down at once). Returns once it is gone."""
        target = self.node(node)
        pids = self.beam_pids(target)
        if not pids:
            raise RuntimeError(f"node {target.name} is not running")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: not self.beam_pids(target),
            timeout_s=30,
            message=f"{target.name}'s beam.smp to exit",
        )
        self._reap(target)

    def restart(
        self,
        node: str | ClusterNode,
        *,
        queue: str | None = None,
        vhost: str = "/",
        timeout_s: float | None = None,
    ) -> float:
        """Start a stopped or killed node again from its own data and wait until it runs in
        the cluster again (and, given ``queue``, until it is an online member of that quorum
        queue again). Returns the seconds it took, also kept in ``timings.restarts``."""
        target = self.node(node)
        if self.beam_pids(target):
            raise RuntimeError(f"node {target.name} is still running: kill() it first")
        began = time.monotonic()
        self._launch(target)
        self._await_boot(target, began + (timeout_s or self.boot_timeout_s))
        wait_for(
            lambda: target.name in self.running_nodes(exclude=target),
            timeout_s=60,
            interval_s=0.5,
            message=f"{target.name} to be running in the cluster again",
        )
        if queue is not None:
            wait_for(
                lambda: target.name in self.online_members_of(queue, vhost),
                timeout_s=60,
                interval_s=0.5,
                message=f"{target.name} to be an online member of {queue!r} again",
            )
        elapsed = time.monotonic() - began
        self.timings.restarts.append((target.name, elapsed))
        return elapsed

    # -- addresses and state ----------------------------------------------------------------

    def node(self, node: str | ClusterNode) -> ClusterNode:
        """A node by name (``jt1-3fa9c2@localhost``) or the node itself."""
        if isinstance(node, ClusterNode):
            return node
        for candidate in self.nodes:
            if candidate.name == node:
                return candidate
        raise KeyError(f"no node {node!r} in this cluster ({[n.name for n in self.nodes]})")

    def urls(self, vhost: str = "/") -> ClusterUrls:
        """Each node's AMQP URL for ``vhost`` and the ``;``-joined failover list."""
        credentials = f"{quote(self.user, safe='')}:{quote(self.password, safe='')}"
        path = quote(vhost, safe="")
        return ClusterUrls(
            {n.name: f"amqp://{credentials}@127.0.0.1:{n.amqp_port}/{path}" for n in self.nodes}
        )

    def add_vhost(self, name: str) -> ClusterUrls:
        """Create ``name`` (cluster-wide) with full permissions for the cluster's user."""
        self.ctl("add_vhost", name)
        self.ctl("set_permissions", "-p", name, self.user, ".*", ".*", ".*")
        return self.urls(name)

    def delete_vhost(self, name: str) -> None:
        self.ctl("delete_vhost", name)

    def running_nodes(self, *, exclude: ClusterNode | None = None) -> list[str]:
        """The cluster's running nodes as one live node (not ``exclude``) sees them."""
        status = json.loads(self.ctl("cluster_status", "--formatter", "json", exclude=exclude))
        return [str(name) for name in status.get("running_nodes", [])]

    def queue_info(self, queue: str, vhost: str = "/") -> dict[str, object]:
        """``list_queues`` of one queue: name, type, leader, members, online, messages (a
        statistic the node refreshes every few seconds: count over AMQP for exact figures)."""
        out = self.ctl(
            "list_queues",
            "-p",
            vhost,
            "name",
            "type",
            "leader",
            "members",
            "online",
            "messages",
            "--formatter",
            "json",
        )
        for row in json.loads(out or "[]"):
            if row.get("name") == queue:
                return dict(row)
        raise KeyError(f"no queue {queue!r} in vhost {vhost!r}")

    def leader_of(self, queue: str, vhost: str = "/") -> str | None:
        """The node leading quorum queue ``queue`` now, or None while it has no leader (an
        election is under way, or no majority is up)."""
        leader = self.queue_info(queue, vhost).get("leader")
        return str(leader) if leader and leader in {n.name for n in self.nodes} else None

    def members_of(self, queue: str, vhost: str = "/") -> list[str]:
        """The quorum queue's members (up or down: a killed node stays a member)."""
        return _names(self.queue_info(queue, vhost).get("members"))

    def online_members_of(self, queue: str, vhost: str = "/") -> list[str]:
        """The members whose replica is running now."""
        return _names(self.queue_info(queue, vhost).get("online"))

    def beam_pids(self, node: str | ClusterNode) -> list[int]:
        """The node's ``beam.smp`` processes (found by ``RABBITMQ_NODENAME`` in their
        environment, so also after this object lost track of them)."""
        name = self.node(node).name
        return [
            pid for pid in _pids_with_env("RABBITMQ_NODENAME", name) if _comm(pid) == "beam.smp"
        ]

    def ctl(
        self,
        *args: str,
        node: str | ClusterNode | None = None,
        exclude: ClusterNode | None = None,
        timeout_s: float = 60.0,
    ) -> str:
        """``rabbitmqctl ARGS`` against ``node`` (default: the first running node other than
        ``exclude``), with the cluster's cookie."""
        target = self.node(node) if node is not None else self._live_node(exclude)
        return rabbitmqctl(
            "--erlang-cookie", self.cookie, *args, node=target.name, timeout_s=timeout_s
        )

    # -- internals --------------------------------------------------------------------------

    def _live_node(self, exclude: ClusterNode | None = None) -> ClusterNode:
        for node in self.nodes:
            if node is not exclude and self.beam_pids(node):
                return node
        raise RuntimeError("no node of the cluster is running")

    def _prepare(self, index: int, *, amqp_port: int, dist_port: int) -> ClusterNode:
        assert self.root is not None
        name = f"{self.prefix}{index}-{self.run}@localhost"
        directory = self.root / name.split("@")[0]
        (directory / "mnesia").mkdir(parents=True)
        (directory / "log").mkdir()
        (directory / "enabled_plugins").write_text("[].\n")
        # loopback_users = none: the default user may also log in through 127.0.0.1 aliases.
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.local = 127.0.0.1:{amqp_port}\nloopback_users = none\n"
        )
        # A quorum queue's at-least-once dead-letter worker, started on a new leader, may
        # build its client for the target queue from a record still naming the dead leader:
        # every forward is rejected and retried only when this timeout fires (default 180 s,
        # and twice that in the worst case) once the dead node is back; delayed jobs sat
        # in celery_delayed_N meanwhile (docs/brokers.md, "Delays after a node's death").
        # Not settable in rabbitmq.conf on 3.10: advanced.config.
        (directory / "advanced.config").write_text(
            f"[{{rabbit, [{{dead_letter_worker_publisher_confirm_timeout, "
            f"{DEAD_LETTER_CONFIRM_TIMEOUT_MS}}}]}}].\n"
        )
        # Our own (empty) env file, so the machine's rabbitmq-env.conf (NODENAME, ...) does
        # not apply to this node.
        (directory / "rabbitmq-env.conf").write_text("")
        # The node finds its cookie in $HOME, which is its directory.
        cookie = directory / ".erlang.cookie"
        cookie.write_text(self.cookie)
        cookie.chmod(0o400)
        return ClusterNode(name, amqp_port, dist_port, directory)

    def _environment(self, node: ClusterNode) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        d = node.directory
        return {
            **keep,
            "HOME": str(d),
            "RABBITMQ_NODENAME": node.name,
            "RABBITMQ_NODE_PORT": str(node.amqp_port),
            "RABBITMQ_DIST_PORT": str(node.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            # Erlang distribution on loopback only (it listens on every interface otherwise).
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }

    def _launch(self, node: ClusterNode) -> None:
        script = server_script()
        assert script is not None
        as_rabbitmq = os.geteuid() == 0
        # Not -detached (it silently did nothing here): the foreground script, in a session
        # of its own, turns SIGTERM into a graceful stop and is reaped by _reap.
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(
                [str(script)],
                env=self._environment(node),
                cwd=node.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                user=RABBITMQ_USER if as_rabbitmq else None,
                group=RABBITMQ_USER if as_rabbitmq else None,
            )
        if as_rabbitmq:
            with contextlib.suppress(OSError):
                os.chown(node.log_path, *_rabbitmq_ids())

    def _await_boot(self, node: ClusterNode, deadline: float) -> None:
        def listening() -> bool:
            if node.process is not None and node.process.poll() is not None:
                raise RuntimeError(
                    f"RabbitMQ node {node.name} exited with {node.process.returncode} while "
                    f"booting:\n{node.log_tail()}"
                )
            return port_answers("127.0.0.1", node.amqp_port)

        try:
            wait_for(
                listening,
                timeout_s=max(deadline - time.monotonic(), 1.0),
                interval_s=0.2,
                message=f"node {node.name} to listen on {node.amqp_port}",
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{node.log_tail()}") from None
        # The listener opens shortly before boot completes: let the node say it is done.
        self.ctl("await_startup", node=node)

    def _join(self, node: ClusterNode) -> None:
        self.ctl("stop_app", node=node)
        self.ctl("join_cluster", self.nodes[0].name, node=node)
        self.ctl("start_app", node=node)

    def _chown(self, root: Path) -> None:
        if os.geteuid() != 0:
            return
        uid, gid = _rabbitmq_ids()
        for dirpath, _dirs, files in os.walk(root):
            os.chown(dirpath, uid, gid)
            for name in files:
                os.chown(os.path.join(dirpath, name), uid, gid)

    def _reap(self, node: ClusterNode) -> None:
        if node.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(10)
            if node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGKILL)
                node.process.wait(10)
            node.process = None


def _rabbitmq_ids() -> tuple[int, int]:
    entry = pwd.getpwnam(RABBITMQ_USER)
    return entry.pw_uid, entry.pw_gid


def _names(value: object) -> list[str]:
    # rabbitmqctl's JSON gives node lists as lists of strings.
    if isinstance(value, list):
        return [str(v) for v in value]
    return []


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports nothing listens on now."""
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.randint(*_PORT_RANGE)
        if port in chosen:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        chosen.append(port)
    return chosen


def _pids(directory: Path = Path("/proc")) -> Iterator[int]:
    for entry in directory.iterdir():
        if entry.name.isdigit():
            yield int(entry.name)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _pids_with_env(variable: str, value: str, pids: Iterable[int] | None = None) -> list[int]:
    """Processes whose environment holds ``variable=value`` exactly."""
    needle = f"{variable}={value}".encode()
    found = []
    for pid in pids if pids is not None else _pids():
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found
