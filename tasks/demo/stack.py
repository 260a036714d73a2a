"""Everything the tour starts, on the embedded defaults, each stopped by the ExitStack.

One worker per queue with its profile (the command ``celery -A tasks worker-profile Q``
runs), two ``celery -A tasks beat``, ``celery -A tasks flower`` (basic auth, state file under
the demo directory), ``celery -A tasks metrics``, the flaky payment gateway and the partner
API stub on loopback. Every process runs in its own process group with its log under
``<demo dir>/logs``; stopping is SIGTERM, then SIGKILL of the whole group at a deadline.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from jobs_platform.testing import WorkerProcess, free_port, port_answers, wait_for
from tasks.demo.flaky import FlakyGateway
from tasks.demo.observe import QUEUES
from tasks.fake_partner import FakePartner

ROOT = Path(__file__).resolve().parents[2]
APP = "tasks"
FLOWER_USER = "demo"
#: Ports the tour prefers (Flower's and the exporter's defaults); a free one if taken.
FLOWER_PORT, METRICS_PORT = 5555, 9808


class Service:
    """A long-running ``celery`` command (beat, Flower, the exporter) in its own process group."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        log_dir: Path,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.cwd = cwd
        self.log_path = log_dir / f"{name}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self._terminated = False
        #: It did not exit within its stop timeout after SIGTERM (and was SIGKILLed).
        self.stuck = False

    def start(self) -> Service:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        self.started_at = time.time()
        return self

    @property
    def pid(self) -> int:
        return 0 if self.process is None else self.process.pid

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode}; its log "
                f"({self.log_path}) ends with:\n{self.log()[-3000:]}"
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self) -> None:
        """SIGTERM, once: a clean stop (beat releases its lock, Flower saves its state)."""
        if self.process is not None and self.process.poll() is None and not self._terminated:
            self._terminated = True
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM, then SIGKILL of the whole group at the deadline."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)
            if self.process.poll() is None:
                self.stuck = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)


def celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", APP, *args]


def http_status(url: str, auth: tuple[str, str] | None = None, timeout_s: float = 5.0) -> int:
    """The status ``url`` answers (0 if nothing answers)."""
    request = urllib.request.Request(url)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    except OSError:
        return 0


def pick_port(preferred: int) -> int:
    return free_port() if port_answers("127.0.0.1", preferred) else preferred


@dataclasses.dataclass
class Stack:
    """The running services and how to reach them."""

    env: dict[str, str]
    demo_dir: Path
    log_dir: Path
    database_url: str
    gateway: FlakyGateway
    partner: FakePartner
    workers: dict[str, WorkerProcess]
    beats: list[Service]
    flower: Service
    flower_url: str
    flower_auth: tuple[str, str]
    exporter: Service
    metrics_url: str
    #: Callbacks that stop what the ExitStack would, keyed by what they stop.
    stoppers: dict[str, Callable[[], None]] = dataclasses.field(default_factory=dict)

    def stop_worker(self, queue: str) -> None:
        self.workers[queue].stop()

    def stop_all(self) -> None:
        """Stop every process at once (each waits for its own clean exit, in parallel)."""
        stops: list[Callable[[], None]] = [
            *(functools.partial(self.stop_worker, q) for q in self.workers),
            *(s.stop for s in (*self.beats, self.flower, self.exporter)),
        ]
        threads = [threading.Thread(target=stop, daemon=True) for stop in stops]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    def worker(self, queue: str, *, suffix: str = "") -> WorkerProcess:
        """A worker for ``queue`` started as ``worker-profile`` starts it (not yet started)."""
        return WorkerProcess.for_profile(
            APP,
            queue,
            hostname=f"{queue}-{suffix or uuid.uuid4().hex[:6]}@demo",
            env=self.env,
            cwd=self.demo_dir,
            log_dir=str(self.log_dir),
        )


def worker_env(
    *, broker_url: str, database_url: str, demo_dir: Path, gateway: str, partner: str
) -> dict[str, str]:
    """The environment every process of the tour gets (on top of the caller's)."""
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "JOBS_BROKER_URL": broker_url,
        "JOBS_DATABASE_URL": database_url,
        "JOBS_APP_DATA": str(demo_dir / "appdata"),
        "JOBS_AUTO_MIGRATE": "0",  # migrated once by the tour, before any worker starts
        # The tour's event log reads task-sent events, which only "on" sends (the producer
        # cannot know a monitor listens).
        "JOBS_TASK_EVENTS": "on",
        "BILLING_GATEWAY_URL": gateway,
        "JOBS_PARTNER_URL": partner,
        "PYTHONPATH": pythonpath,
    }


def start(
    stack: contextlib.ExitStack,
    *,
    broker_url: str,
    database_url: str,
    demo_dir: Path,
    seed: int,
    stock_sync_every_s: float,
    say: Callable[[str], None],
) -> Stack:
    """Start every service, registering each one's stop on ``stack`` first."""
    log_dir = demo_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    gateway = FlakyGateway(seed=seed)
    gateway.start()
    stack.callback(gateway.stop)
    partner = stack.enter_context(FakePartner())
    partner.server.handle_error = lambda request, client_address: None  # type: ignore[method-assign]
    env = worker_env(
        broker_url=broker_url,
        database_url=database_url,
        demo_dir=demo_dir,
        gateway=gateway.url,
        partner=partner.url,
    )
    flower_auth = (FLOWER_USER, f"demo-{secrets.token_hex(4)}")
    flower_port, metrics_port = pick_port(FLOWER_PORT), pick_port(METRICS_PORT)
    services = Stack(
        env=env,
        demo_dir=demo_dir,
        log_dir=log_dir,
        database_url=database_url,
        gateway=gateway,
        partner=partner,
        workers={},
        beats=[
            Service(
                f"beat-{n}",
                celery("beat", "-l", "info", "-s", str(demo_dir / f"beat-{n}-schedule")),
                env={**env, "SHOP_STOCK_SYNC_EVERY_S": f"{stock_sync_every_s:g}"},
                cwd=demo_dir,
                log_dir=log_dir,
            )
            for n in (1, 2)
        ],
        flower=Service(
            "flower",
            celery("flower", f"--port={flower_port}", "--address=127.0.0.1"),
            env={
                **env,
                "JOBS_FLOWER_BASIC_AUTH": ":".join(flower_auth),
                "JOBS_FLOWER_DB": str(demo_dir / "flower.db"),
            },
            cwd=demo_dir,
            log_dir=log_dir,
        ),
        flower_url=f"http://127.0.0.1:{flower_port}",
        flower_auth=flower_auth,
        exporter=Service(
            "metrics",
            celery("metrics", "--port", str(metrics_port)),
            env=env,
            cwd=demo_dir,
            log_dir=log_dir,
        ),
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
    )
    for queue in QUEUES:
        proc = services.workers[queue] = services.worker(queue)
        # By queue, not by object: a worker restarted by the tour is stopped too.
        stack.callback(functools.partial(services.stop_worker, queue))
        proc.start(wait=False)
    for service in (*services.beats, services.flower, services.exporter):
        stack.callback(service.stop)
        service.start()
    # Runs first on the way out; the single stops above are then no-ops (or finish the job
    # if this one was interrupted).
    stack.callback(services.stop_all)
    say(
        "started: a worker per queue (fast, heavy, thirdparty) with its profile, two beats, "
        f"Flower and the metrics exporter; logs in {log_dir}"
    )
    wait_ready(services)
    return services


def wait_ready(services: Stack, timeout_s: float = 180.0) -> None:
    """Every worker says it is ready, Flower and the exporter answer, a beat leads."""
    for proc in services.workers.values():
        proc.wait_ready(timeout_s)

    def answers(service: Service, url: str) -> bool:
        service.check_alive()
        return http_status(url) == 200

    wait_for(
        lambda: answers(services.exporter, services.metrics_url),
        timeout_s=timeout_s,
        interval_s=0.2,
        message="the metrics exporter",
    )
    wait_for(
        lambda: answers(services.flower, f"{services.flower_url}/healthcheck"),
        timeout_s=timeout_s,
        interval_s=0.2,
        message="Flower",
    )

    def leading() -> bool:
        for beat in services.beats:
            beat.check_alive()
        return any(" leads (" in beat.log() for beat in services.beats)

    wait_for(leading, timeout_s=timeout_s, interval_s=0.2, message="a beat to lead")
