"""The chaos soak: ``python -m bench.chaos --jobs N`` (``make chaos``; docs/chaos.md).

A mixed workload runs on one worker per queue (each started with its profile) while the
soak breaks things, then checks the accounting invariant and exits non-zero unless it holds:

1. every enqueued job either succeeded or was dead-lettered: none lost, none both;
2. no job ran more than ``max_retries + 1`` attempts; runs beyond a job's retry ladder
   happen only on jobs re-sent after a kill (a redelivered message, or Celery's retry for a
   killed pool process) or that the producer sent again after a failed dispatch, and are
   counted apart;
3. no guarded side effect happened twice: the gateway charged each order at most once
   (exactly once when its charge job succeeded) and mailed each receipt at most once,
   except in the key table's documented window (an attempt killed after the send and
   before its record), counted apart;
4. each dead letter exactly once: no task id has two rows;
5. every job ended as its plan says (a permanent failure never succeeds, a job that
   always fails is dead-lettered, one that recovers succeeds unless kills used up its
   retries), and every beat slot that was sent ran, under one task id.

Services, all private and on loopback: a ``redis-server --appendonly yes`` (the broker),
a fresh PostgreSQL database on 127.0.0.1:5432 (dropped at the end) that workers reach
through an in-process TCP proxy, and an in-process payment gateway. Workload: plain jobs
(30% fail transiently first, 2% fail permanently), charges guarded by the status CAS and
the gateway's idempotency key, receipts guarded by the key table, short delays (Celery's
path) and long ones (the durable delayed store, with a 30 s visibility timeout), and a
``celery beat`` with a 1-second entry. Faults: SIGKILL of a whole worker (its process
group) and of one pool child, alternately every ``--fault-every`` seconds, each followed
by a restart; one SIGKILL + restart of the redis-server (same port, same AOF directory);
one cut of the database (the proxy drops every connection and refuses new ones); and
gateway 503s. Figures are printed and written to ``bench/results/chaos.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from bench.chaos_cluster import ClusterBroker, LeaderKill, resume_times
from jobs_platform.routing import QUEUE_NAMES
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[1]
APP = "bench.chaos_app"
PG_ADMIN_URL = os.environ.get(
    "JOBS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
RESULTS = ROOT / "bench" / "results" / "chaos.json"
#: The soak's timing settings: a short visibility timeout so that a killed worker's jobs
#: come back within the run and delays of 10 s or more go to the durable store
#: (wait + the tasks' 10 s hard limit >= 30 - 10).
VISIBILITY_TIMEOUT_S = 30
VISIBILITY_MARGIN_S = 10
LONG_DELAY_S = (12.0, 18.0)
SHORT_DELAY_S = (1.0, 4.0)
DB_CUT_S = 3.0
GATEWAY_LATENCY_S = 0.08
REDIS_DOWN_S = 2.0
#: How long a killed RabbitMQ node stays down before the soak restarts it.
LEADER_DOWN_S = 5.0
BROKERS = ("redis", "rabbitmq-cluster")
#: Most jobs waiting in the queues before the producer pauses (it must not outrun the fleet).
MAX_BACKLOG = 400


# -- the workload ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Job:
    task_id: str
    task: str
    args: tuple[Any, ...]
    plan: str  # ok | transient | exhaust | permanent | charge | receipt
    delay_s: float | None = None
    order: int | None = None


def plan_jobs(n: int, rng: random.Random) -> tuple[list[Job], dict[int, int]]:
    """``n`` jobs (30% transient failures, 2% permanent, guarded charges and receipts,
    some delayed) and the orders they touch (id -> amount in cents)."""
    jobs: list[Job] = []
    orders: dict[int, int] = {}
    for i in range(n):
        task_id = f"chaos-{i:06d}-{uuid.uuid4().hex[:8]}"
        r = rng.random()
        if r < 0.10:
            if not orders or rng.random() < 0.8:
                order = len(orders) + 1
                orders[order] = rng.randrange(100, 100_000)
            else:  # the same charge dispatched again: the guards must absorb it
                order = rng.choice(list(orders))
            jobs.append(Job(task_id, "chaos.charge", (order,), "charge", order=order))
            continue
        if r < 0.15 and orders:
            order = rng.choice(list(orders))
            jobs.append(Job(task_id, "chaos.receipt", (order,), "receipt", order=order))
            continue
        s = rng.random()
        plan, fail_times = "ok", 0
        if s < 0.02:
            plan = "permanent"
        elif s < 0.05:
            plan = "exhaust"
        elif s < 0.32:
            plan, fail_times = "transient", rng.choice((1, 2))
        task = "chaos.crunch" if rng.random() < 0.2 else "chaos.work"
        delay = None
        if rng.random() < 0.08:
            delay = round(rng.uniform(*(SHORT_DELAY_S if rng.random() < 0.5 else LONG_DELAY_S)), 2)
        jobs.append(Job(task_id, task, (i, plan, fail_times), plan, delay_s=delay))
    return jobs, orders


# -- the payment gateway -----------------------------------------------------------------------


class Gateway:
    """A card gateway and mailer on loopback that counts what the outside world saw.

    ``POST /charges`` with an ``Idempotency-Key`` charges once per key (a repeat gets the
    first charge back); ``POST /emails`` sends every time. ``fail_next(n)`` makes the next n
    charge requests answer 503 without charging.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charges: collections.Counter[str] = collections.Counter()
        self.emails: collections.Counter[str] = collections.Counter()
        self.charge_ids: dict[str, str] = {}
        self.by_key: dict[str, dict[str, Any]] = {}
        self.replays = 0
        self.busy = 0
        self._faults = 0
        self.server = _QuietServer(("127.0.0.1", 0), _gateway_handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def charge(self, body: dict[str, Any], key: str | None) -> tuple[int, dict[str, Any]]:
        time.sleep(GATEWAY_LATENCY_S)  # a card network is not instant: charges overlap
        with self.lock:
            if self._faults > 0:
                self._faults -= 1
                self.busy += 1
                return 503, {"error": "busy, nothing charged"}
            if key is not None and key in self.by_key:
                self.replays += 1
                return 200, self.by_key[key]
            reference = str(body.get("reference"))
            self.charges[reference] += 1
            charge = {"id": f"ch_{sum(self.charges.values())}", "reference": reference}
            self.charge_ids[reference] = charge["id"]
            if key is not None:
                self.by_key[key] = charge
            return 201, charge

    def email(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.emails[str(body.get("reference"))] += 1
            return 201, {"id": f"em_{sum(self.emails.values())}"}

    def fail_next(self, count: int) -> None:
        with self.lock:
            self._faults = count

    def __enter__(self) -> Gateway:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class _QuietServer(ThreadingHTTPServer):
    """A client killed mid-request (the soak's own doing) is not worth a traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _gateway_handler(gateway: Gateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            if self.path == "/charges":
                status, payload = gateway.charge(body, self.headers.get("Idempotency-Key"))
            elif self.path == "/emails":
                status, payload = gateway.email(body)
            else:
                status, payload = 404, {"error": "not found"}
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            return

    return Handler


# -- the database, behind a proxy that can cut it ----------------------------------------------


class TcpProxy:
    """A TCP forwarder on a free loopback port (asyncio, in a thread of this process).

    ``cut(s)`` drops every open connection at once and refuses new ones for ``s`` seconds,
    as a database failover or a network partition does.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0
        self.cut_until = 0.0
        self.dropped = 0
        self.refused = 0
        self._open: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    def __enter__(self) -> TcpProxy:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def cut(self, seconds: float) -> None:
        self.loop.call_soon_threadsafe(self._cut, seconds)

    def _cut(self, seconds: float) -> None:
        self.cut_until = time.monotonic() + seconds
        self.dropped += len(self._open) // 2
        for writer in list(self._open):
            writer.transport.abort()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._open):
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self.cut_until:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        pair = {writer, up_writer}
        self._open |= pair
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._open -= pair


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.transport.abort()  # one side gone: the connection is over


@contextlib.contextmanager
def private_database() -> Iterator[str]:
    """A fresh PostgreSQL database (its URL), dropped even if still in use at the end."""
    name = f"chaos_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def through(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = sa.make_url(url)
    return parts.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


# -- the fleet ---------------------------------------------------------------------------------


def pool_children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _why_exited(log: str) -> str:
    """The line of a worker's log that says why it stopped (Celery logs it as CRITICAL)."""
    lines = log.splitlines()
    critical = [line for line in lines if "CRITICAL/" in line]
    return (critical or lines or ["(empty log)"])[-1][-400:]


class Fleet:
    """One worker per queue, started with its profile, and the beat; replaced when killed."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.workers: dict[str, WorkerProcess] = {}
        self.beat: WorkerProcess | None = None
        self.started = 0
        self.unexpected_exits: list[str] = []
        #: (queue, wall time of the SIGKILL, wall time its main process was reaped)
        self.kill_windows: list[tuple[str, float, float]] = []
        self.child_kills: list[tuple[str, float]] = []
        self.lock = threading.Lock()

    def _new(self, queue: str) -> WorkerProcess:
        self.started += 1
        return WorkerProcess.for_profile(
            APP,
            queue,
            hostname=f"{queue}-{self.started}@chaos",
            env=self.env,
            cwd=ROOT,
            log_dir=str(self.log_dir),
        )

    def start(self) -> None:
        for queue in QUEUE_NAMES:
            self.workers[queue] = self._new(queue).start(wait=False)
        for worker in self.workers.values():
            worker.wait_ready(180)

    def start_beat(self, every_s: float) -> None:
        self.beat = WorkerProcess(
            APP,
            [],
            env={**self.env, "CHAOS_BEAT_EVERY": str(every_s)},
            cwd=ROOT,
            hostname="beat@chaos",
            log_dir=str(self.log_dir),
            argv=[sys.executable, "-m", "celery", "-A", APP, "beat", "-l", "INFO"],
        ).start(wait=False)
        beat = self.beat
        wait_for(lambda: "beat: Starting" in beat.log(), timeout_s=120, message="beat to start")

    def ready(self, queue: str) -> bool:
        worker = self.workers[queue]
        return worker.alive and f"{worker.hostname} ready." in worker.log()

    def kill_worker(self, queue: str) -> None:
        """SIGKILL the worker's whole process group, then start a replacement (not awaited:
        the fleet runs one worker short meanwhile, as after a real crash)."""
        with self.lock:
            killed_at = time.time()
            self.workers[queue].kill()
            self.kill_windows.append((queue, killed_at, time.time()))
            self.workers[queue] = self._new(queue).start(wait=False)

    def kill_child(
        self, queue: str, rng: random.Random, signum: int = signal.SIGKILL
    ) -> bool | None:
        """SIGKILL (or ``signum``: SIGTERM is how Celery cancels) one pool process of the
        worker (its main process forks a new one): one busy with a job if there is one
        (True), else any (False); None if it had none."""
        worker = self.workers[queue]
        children = pool_children(worker.process.pid) if worker.process else []
        if not children:
            return None
        busy = [pid for pid in children if self._busy(pid)]
        with contextlib.suppress(ProcessLookupError):
            os.kill(rng.choice(busy or children), signum)
        self.child_kills.append((queue, time.time()))
        return bool(busy)

    def _busy(self, pid: int) -> bool:
        """Whether the pool process's newest ledger record is a run that has not ended."""
        path = Path(self.env["CHAOS_LEDGER_DIR"]) / f"{pid}.jsonl"
        try:
            with path.open("rb") as ledger:
                ledger.seek(max(0, path.stat().st_size - 1024))
                tail = ledger.read().splitlines()
        except OSError:
            return False
        return bool(tail) and tail[-1].startswith(b'{"e":"run"')

    def supervise(self) -> None:
        """Restart a worker that exited by itself (as systemd would), and count it."""
        with self.lock:
            for queue, worker in list(self.workers.items()):
                if not worker.alive:
                    self.unexpected_exits.append(f"{worker.hostname}: {_why_exited(worker.log())}")
                    self.workers[queue] = self._new(queue).start(wait=False)

    def stop_beat(self) -> None:
        if self.beat is not None:
            self.beat.stop()

    def stop(self) -> None:
        self.stop_beat()
        for worker in self.workers.values():
            worker.stop(timeout_s=30)


# -- faults ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Faults:
    worker_kills: int = 0
    child_kills: int = 0
    busy_child_kills: int = 0  # the process was running a job
    child_kills_missed: int = 0  # the worker had no pool process at that moment
    child_terms: int = 0  # SIGTERM to a pool process (Celery's own cancel signal)
    busy_child_terms: int = 0
    redis_restarts: int = 0
    leader_kills: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    db_cuts: int = 0
    db_cut_at: float | None = None  # wall time
    gateway_503s: int = 0
    log: list[str] = dataclasses.field(default_factory=list)


class Chaos(threading.Thread):
    """Injects the faults while the producer runs (stopped with :meth:`finish`)."""

    def __init__(
        self,
        *,
        fleet: Fleet,
        redis_server: RedisServer | None,
        proxy: TcpProxy,
        gateway: Gateway,
        every_s: float,
        duration_s: float,
        rng: random.Random,
        cluster: ClusterBroker | None = None,
        leader_kills: int = 1,
        leader_down_s: float = LEADER_DOWN_S,
    ) -> None:
        super().__init__(daemon=True, name="chaos")
        self.fleet, self.redis_server, self.proxy, self.gateway = (
            fleet,
            redis_server,
            proxy,
            gateway,
        )
        self.cluster = cluster
        self.leader_down_s = leader_down_s
        self.leader_threads: list[LeaderKill] = []
        self.every_s = every_s
        self.rng = rng
        self.faults = Faults()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.started_at = time.monotonic()
        # The broker fault: one redis-server restart at 35% of the run; on a cluster,
        # ``leader_kills`` leader kills spread from 30% to 80% (one at a time).
        if cluster is None:
            fractions = [0.35]
        elif leader_kills == 1:
            fractions = [0.3]
        else:
            fractions = [0.3 + 0.5 * i / (leader_kills - 1) for i in range(leader_kills)]
        self.broker_at = [self.started_at + f * duration_s for f in fractions]
        self.db_at = self.started_at + 0.65 * duration_s

    def finish(self) -> Faults:
        self.done.set()
        self.join(300)
        for thread in self.leader_threads:
            thread.join(300)
            if thread.record is not None:
                self.faults.leader_kills.append(thread.record.as_dict())
        if self.error is not None:
            raise RuntimeError(f"fault injection failed: {self.error!r}") from self.error
        return self.faults

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    def _run(self) -> None:
        kinds = ["worker", "child", "term"]
        next_fault = time.monotonic() + self.every_s
        next_gateway = time.monotonic() + 3.0
        while not self.done.wait(0.2):
            now = time.monotonic()
            self.fleet.supervise()
            if now >= next_gateway:
                self.gateway.fail_next(2)
                next_gateway = now + 3.0
            if self.broker_at and now >= self.broker_at[0] and not self._leader_busy():
                self.broker_at.pop(0)
                self._broker_fault()
            elif self.db_at and now >= self.db_at:
                self.db_at = 0.0
                self._cut_database()
            elif now >= next_fault:
                ready = [queue for queue in QUEUE_NAMES if self.fleet.ready(queue)]
                if ready:  # a worker still starting up is not worth killing again
                    kinds.append(kinds.pop(0))
                    self._kill(kinds[0], self.rng.choice(ready))
                next_fault = time.monotonic() + self.every_s * self.rng.uniform(0.7, 1.3)
        self.faults.gateway_503s = self.gateway.busy

    def _say(self, text: str) -> None:
        self.faults.log.append(f"{time.monotonic() - self.started_at:7.1f} s  {text}")
        print(f"  chaos {self.faults.log[-1]}", flush=True)

    def _kill(self, kind: str, queue: str) -> None:
        if kind == "worker":
            self._say(f"SIGKILL worker {queue} (process group); restarting it")
            self.faults.worker_kills += 1
            self.fleet.kill_worker(queue)
            return
        term = kind == "term"
        busy = self.fleet.kill_child(queue, self.rng, signal.SIGTERM if term else signal.SIGKILL)
        if busy is None:
            self.faults.child_kills_missed += 1
            return
        how = "SIGTERM" if term else "SIGKILL"
        self._say(f"{how} one pool process of worker {queue} ({'busy' if busy else 'idle'})")
        if term:
            self.faults.child_terms += 1
            self.faults.busy_child_terms += busy
        else:
            self.faults.child_kills += 1
            self.faults.busy_child_kills += busy

    def _leader_busy(self) -> bool:
        return any(thread.is_alive() for thread in self.leader_threads)

    def _broker_fault(self) -> None:
        if self.cluster is None:
            self._restart_redis()
            return

        def on_kill(killed_at: float) -> None:
            # Every consumer connected to the node lost its connection (for attribution).
            self.fleet.kill_windows.append((EVERY_QUEUE, killed_at, killed_at + 1.0))

        thread = LeaderKill(self.cluster, down_s=self.leader_down_s, say=self._say, on_kill=on_kill)
        self.leader_threads.append(thread)
        thread.start()

    def _restart_redis(self) -> None:
        self._say("SIGKILL redis-server; restarting it on the same port and AOF directory")
        assert self.redis_server is not None
        process = self.redis_server.process
        assert process is not None
        killed_at = time.time()
        process.kill()
        process.wait(30)
        time.sleep(REDIS_DOWN_S)
        self.redis_server.start()
        self.fleet.kill_windows.append((EVERY_QUEUE, killed_at, time.time()))
        self.faults.redis_restarts += 1

    def _cut_database(self) -> None:
        self._say(f"database cut: the proxy drops every connection, refuses for {DB_CUT_S:g} s")
        self.faults.db_cut_at = time.time()
        self.proxy.cut(DB_CUT_S)
        self.faults.db_cuts += 1


# -- the producer ------------------------------------------------------------------------------


class Producer:
    """Sends the jobs at ``rate``/s, pausing while the queues are deep; a failed dispatch is
    sent again with the same task id and enqueue stamp (the producer cannot know whether the
    broker stored it).

    A failed dispatch is the platform's DispatchError (the broker did not answer), or on
    RabbitMQ a publish the broker refused: a confirm that came back as a nack
    (``amqp.exceptions.MessageNacked``: a quorum queue without a leader during an election
    refuses the publish, and kombu retries only lost connections, not nacks). A nack does
    not prove the message was not stored, so it is sent again too, under the same task id:
    a job is never counted as lost for a refusal, and a copy that was stored after all is a
    second run the checks explain by the re-dispatch (``redispatched``). ``refused`` counts
    the failures by exception type.
    """

    def __init__(self, app_module: Any, backlog: Callable[[], int], rate: float) -> None:
        self.tasks = {t.name: t for t in _tasks(app_module)}
        self.backlog = backlog
        self.rate = rate
        self.redispatched: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()
        #: (wall time, seconds) of every stretch the producer spent re-sending one job
        self.stalls: list[tuple[float, float]] = []
        #: task id -> wall time of its first dispatch attempt
        self.sent_at: dict[str, float] = {}

    def run(self, jobs: list[Job], on_progress: Callable[[int], None]) -> None:
        from amqp.exceptions import MessageNacked

        from jobs_platform.clock import utc_iso
        from jobs_platform.errors import DispatchError
        from jobs_platform.history import ENQUEUED_HEADER

        start = time.monotonic()
        for i, job in enumerate(jobs):
            pause = start + i / self.rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            if i % 25 == 0:
                self._wait_for_room()
                on_progress(i)
            headers = {ENQUEUED_HEADER: utc_iso()}
            self.sent_at[job.task_id] = time.time()
            began = time.monotonic()
            deadline = began + 120
            while True:
                try:
                    self.tasks[job.task].apply_async(
                        job.args, task_id=job.task_id, countdown=job.delay_s, headers=headers
                    )
                    break
                except (DispatchError, MessageNacked) as exc:
                    if time.monotonic() > deadline:
                        raise
                    self.refused[type(exc).__name__] += 1
                    self.redispatched[job.task_id] += 1
                    time.sleep(0.5)
            if self.redispatched.get(job.task_id):
                self.stalls.append((self.sent_at[job.task_id], time.monotonic() - began))

    def _wait_for_room(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.backlog() < MAX_BACKLOG:
                    return
            except Exception:  # the broker is down or failing over: wait for it
                pass
            time.sleep(0.2)


def _queue_lists(app: Any) -> list[str]:
    from jobs_platform.brokers.redis.layout import BrokerLayout

    layout = BrokerLayout.from_app(app)
    return [name for queue in layout.queues for name in layout.sublists(queue)]


def backlog(client: redis.Redis, sublists: list[str]) -> int:
    with client.pipeline(transaction=False) as pipe:
        for name in sublists:
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())


def quiet(client: redis.Redis, sublists: list[str], app: Any) -> bool:
    """Nothing queued, held, delayed or spooled anywhere on the broker."""
    from jobs_platform.brokers.redis.options import keys_for

    settings = app.jobs_settings
    try:
        with client.pipeline(transaction=False) as pipe:
            for name in sublists:
                pipe.llen(name)
            pipe.hlen("unacked")
            pipe.zcard(keys_for(app).due)
            pipe.llen(settings.dlq_spool_key)
            return not any(int(n) for n in pipe.execute())
    except redis.RedisError:
        return False


# -- the evidence ------------------------------------------------------------------------------


@dataclasses.dataclass
class Ledger:
    """Everything the tasks wrote down (bench/chaos_app.py)."""

    runs: dict[str, list[dict[str, Any]]]
    ok: set[str]
    dups: collections.Counter[str]
    ticks: dict[str, set[str]]  # slot -> task ids
    unreadable: int
    ends: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # id -> end times

    @classmethod
    def read(cls, directory: Path) -> Ledger:
        runs: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        ok: set[str] = set()
        dups: collections.Counter[str] = collections.Counter()
        ticks: dict[str, set[str]] = collections.defaultdict(set)
        ends: dict[str, list[float]] = collections.defaultdict(list)
        unreadable = 0
        for path in directory.glob("*.jsonl"):
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    unreadable += 1
                    continue
                event, task_id = record["e"], record["id"]
                if event == "run":
                    runs[task_id].append(record)
                elif event == "ok":
                    ok.add(task_id)
                elif event == "dup":
                    dups[record["guard"]] += 1
                elif event == "tick":
                    ticks[str(record["slot"])].add(task_id)
                elif event == "end":
                    ends[task_id].append(float(record["ts"]))
        return cls(dict(runs), ok, dups, dict(ticks), unreadable, dict(ends))


def dead_letters(url: str) -> list[tuple[str, str]]:
    """``(task_id, reason)`` of every row of the dead-letter table."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT task_id, reason FROM dead_letter_jobs"))
            return [(str(task_id), str(reason)) for task_id, reason in rows]
    finally:
        engine.dispose()


def paid_orders(url: str) -> dict[int, str | None]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT id, charge_id FROM chaos_orders WHERE status = 'paid'")
            )
            return {int(order): charge for order, charge in rows}
    finally:
        engine.dispose()


class SlotWatch:
    """The beat's slot records (``jobs:beat:slot:<entry>:<slot>``), collected while they
    live: they expire 10 minutes after their slot, and a long soak outlasts that."""

    def __init__(self, entry: str) -> None:
        from jobs_platform.schedule.slots import SLOT_PREFIX

        self.pattern = f"{SLOT_PREFIX}{entry}:*"
        self.prefix = f"{SLOT_PREFIX}{entry}:"
        self.sent: set[str] = set()
        self.skipped: set[str] = set()

    def collect(self, client: redis.Redis) -> None:
        with contextlib.suppress(redis.RedisError):
            keys = [k.decode() for k in client.scan_iter(self.pattern, count=1000)]
            values = client.mget(keys) if keys else []
            for key, value in zip(keys, values, strict=True):
                slot = key[len(self.prefix) :]
                if value is None:
                    continue
                text = value.decode() if isinstance(value, bytes) else str(value)
                (self.skipped if text.startswith("skipped:") else self.sent).add(slot)


# -- the verdict -------------------------------------------------------------------------------


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"INVARIANT {self.name}: {'OK' if self.ok else 'VIOLATED'} ({self.detail})"


#: The queue name of a connection loss that hit every queue (the redis-server restart).
EVERY_QUEUE = "*"


@dataclasses.dataclass(frozen=True)
class ConnectionLosses:
    """When a queue's consumer lost its broker connection, to say where a lost job went.

    kombu's Redis transport takes a message with BRPOP and records it as unacknowledged
    only afterwards, in the worker: a message Redis hands over just as the consumer's
    connection dies (its worker SIGKILLed, or the redis-server killed) is in neither the
    queue nor the unacked hash, so no visibility timeout brings it back (docs/chaos.md).
    ``windows``: (queue or EVERY_QUEUE, start, end) wall times.
    """

    windows: list[tuple[str, float, float]]
    slack_s: float = 0.5

    def overlap(self, queue: str, lo: float, hi: float) -> bool:
        return any(
            q in (queue, EVERY_QUEUE) and start - self.slack_s <= hi and lo <= end + self.slack_s
            for q, start, end in self.windows
        )


class PopClock:
    """When each queue's consumer popped what: one worker per queue pops its list in order,
    so a message pushed at time t was popped before the next producer job pushed after t
    started running (undelayed jobs whose first run was not a redelivery)."""

    def __init__(
        self, jobs: list[Job], ledger: Ledger, sent_at: dict[str, float], queue_of: dict[str, str]
    ) -> None:
        self.by_queue: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for job in jobs:
            runs = ledger.runs.get(job.task_id)
            if job.delay_s or not runs or job.task_id not in sent_at:
                continue
            first = min(runs, key=lambda r: float(r["ts"]))
            if int(first["attempt"]) == 1 and not first["redelivered"]:
                self.by_queue[queue_of[job.task]].append((sent_at[job.task_id], float(first["ts"])))
        for entries in self.by_queue.values():
            entries.sort()

    def popped_between(self, queue: str, pushed_at: float) -> tuple[float, float]:
        entries = self.by_queue.get(queue, [])
        after = bisect.bisect_right(entries, (pushed_at, math.inf))
        following = [started for _, started in entries[after : after + 50]]
        return pushed_at, min(following) if following else pushed_at + 60.0


def last_push(task_id: str, ledger: Ledger, sent_at: dict[str, float]) -> float | None:
    """When the job's newest message was published: its last run (a retry is published as
    the run ends), else the producer's dispatch."""
    runs = ledger.runs.get(task_id)
    if runs:
        return max(float(r["ts"]) for r in runs)
    return sent_at.get(task_id)


def check_accounting(
    expected: dict[str, str],
    ledger: Ledger,
    letters: list[tuple[str, str]],
    losses: ConnectionLosses,
    pops: PopClock,
    sent_at: dict[str, float],
) -> tuple[Check, dict[str, Any]]:
    """``expected``: task id -> its queue."""
    dead = {task_id for task_id, _ in letters}
    lost = set(expected) - ledger.ok - dead
    both = ledger.ok & dead
    unknown = (set(ledger.runs) | dead) - set(expected)
    in_window = []
    for task_id in sorted(lost):
        pushed_at = last_push(task_id, ledger, sent_at)
        if pushed_at is not None and losses.overlap(
            expected[task_id], *pops.popped_between(expected[task_id], pushed_at)
        ):
            in_window.append(task_id)
    figures = {
        "succeeded": len(ledger.ok & set(expected)),
        "dead_lettered": len(dead & set(expected)),
        "lost": sorted(lost)[:20],
        "lost_in_a_kill_window": in_window[:20],
        "lost_in_a_kill_window_count": len(in_window),
        "lost_details": [
            {
                "id": t,
                "queue": expected[t],
                "last_push": last_push(t, ledger, sent_at),
                "runs": len(ledger.runs.get(t, [])),
            }
            for t in sorted(lost)[:50]
        ],
        "both": sorted(both)[:20],
        "unknown": sorted(unknown)[:20],
    }
    ok = not lost and not both and not unknown
    detail = (
        f"{len(expected)} jobs: {figures['succeeded']} succeeded, {figures['dead_lettered']} "
        f"dead-lettered, {len(lost)} lost ({len(in_window)} of them popped while their "
        f"consumer's connection died), {len(both)} both, {len(unknown)} unknown"
    )
    return Check("every job succeeded or was dead-lettered, none lost, none both", ok, detail), {
        **figures,
        "lost_count": len(lost),
        "both_count": len(both),
    }


def check_attempts(
    ledger: Ledger,
    redispatched: collections.Counter[str],
    max_attempts: dict[str, int],
    leader_kills: Sequence[float] = (),
) -> tuple[Check, dict[str, Any]]:
    """``leader_kills``: wall times of RabbitMQ leader kills. A delayed message waiting in
    a delayed-delivery queue when its leader died can reach its work queue twice, not
    flagged redelivered (the new leader dead-letters it again: at-least-once
    dead-lettering); such a second run within 30 s after a kill is counted apart."""
    over_cap: list[str] = []
    unexplained: list[str] = []
    runs = redelivered_runs = beyond_ladder = lost_retries = 0
    redelivered_jobs = dead_lettered_twice = 0
    for task_id, records in ledger.runs.items():
        attempts = [int(r["attempt"]) for r in records]
        redelivered = sum(1 for r in records if r["redelivered"])
        runs += len(records)
        redelivered_runs += redelivered
        redelivered_jobs += bool(redelivered)
        lost_retries += max(int(r["lost"]) for r in records)
        extra = len(attempts) - len(set(attempts))
        beyond_ladder += extra
        if max(attempts) > max_attempts[records[0]["task"]]:
            over_cap.append(task_id)
        # A run re-sent after a kill: a redelivered message, or the retry a worker publishes
        # for a job whose pool process was killed (that job may have published its own retry
        # just before dying: then it goes on twice, both copies within the cap).
        resent = redelivered or any(int(r["lost"]) for r in records)
        if extra and not resent and not redispatched.get(task_id):
            if any(k <= float(r["ts"]) <= k + 30 for r in records for k in leader_kills):
                dead_lettered_twice += 1
            else:
                unexplained.append(task_id)
    figures = {
        "runs": runs,
        "redelivered_runs": redelivered_runs,
        "redelivered_jobs": redelivered_jobs,
        "runs_beyond_retry_ladder": beyond_ladder,
        "retries_after_pool_process_killed": lost_retries,
        "redispatched_jobs": len(redispatched),
        "delayed_jobs_delivered_twice_at_a_leader_kill": dead_lettered_twice,
        "over_cap": over_cap[:20],
        "unexplained": unexplained[:20],
    }
    detail = (
        f"{runs} runs; no attempt above max_retries + 1: {len(over_cap)} over; "
        f"{beyond_ladder} runs beyond a retry ladder, {len(unexplained)} not explained by "
        f"a redelivery ({redelivered_runs} redelivered runs), a lost-worker retry or a "
        "re-dispatch"
    )
    return Check(
        "attempts within max_retries + 1, redeliveries apart",
        not over_cap and not unexplained,
        detail,
    ), figures


def check_side_effects(
    jobs: list[Job],
    ledger: Ledger,
    gateway: Gateway,
    paid: dict[int, str | None],
    db_cut_at: float | None = None,
) -> tuple[Check, dict[str, Any]]:
    """Charges (the gateway dedupes by idempotency key) exactly once per charged order, and
    never twice. Receipts (the mailer dedupes nothing; the key table guards them) once per
    order, except in the key table's documented window (docs/side-effects.md): an attempt
    killed after the send and before its record; the next attempt sends again. A repeat
    counts as in that window only if a receipt job of the order had an attempt killed."""

    def orders_done(plan: str) -> set[int]:
        return {int(j.order or 0) for j in jobs if j.plan == plan and j.task_id in ledger.ok}

    def cut(record: dict[str, Any]) -> bool:
        # An attempt running while the database was cut: the send went out and the key
        # table could not record it (the same window as a kill between the two).
        at = float(record["ts"])
        return db_cut_at is not None and db_cut_at - 1 <= at <= db_cut_at + DB_CUT_S + 1

    killed_receipts = {
        f"order-{j.order}"
        for j in jobs
        if j.plan == "receipt"
        and any(
            int(r["lost"]) or r["redelivered"] or cut(r) for r in ledger.runs.get(j.task_id, [])
        )
    }
    charged, mailed = orders_done("charge"), orders_done("receipt")
    twice = [f"charge {ref}" for ref, n in gateway.charges.items() if n > 1]
    in_window = [ref for ref, n in gateway.emails.items() if n > 1 and ref in killed_receipts]
    twice += [f"e-mail {r}" for r, n in gateway.emails.items() if n > 1 and r not in in_window]
    missing_charge = [o for o in charged if gateway.charges[f"order-{o}"] != 1]
    missing_mail = [o for o in mailed if gateway.emails[f"order-{o}"] < 1]
    unpaid = [o for o in charged if paid.get(o) != gateway.charge_ids.get(f"order-{o}")]
    figures = {
        "orders_charged": len(charged),
        "receipts_sent": len(mailed),
        "gateway_charges": sum(gateway.charges.values()),
        "gateway_emails": sum(gateway.emails.values()),
        "twice": twice[:20],
        "emails_repeated_after_a_kill_mid_send": in_window[:20],
        "missing_charge": missing_charge[:20],
        "missing_receipt": missing_mail[:20],
        "not_paid_in_database": unpaid[:20],
    }
    ok = not (twice or missing_charge or missing_mail or unpaid)
    detail = (
        f"{len(charged)} orders charged, {figures['gateway_charges']} gateway charges, "
        f"{len(mailed)} receipts, {figures['gateway_emails']} e-mails; "
        f"{len(twice)} side effects twice, {len(missing_charge) + len(missing_mail)} missing, "
        f"{len(unpaid)} paid orders out of step with the gateway; {len(in_window)} e-mails "
        "repeated after the sending attempt was killed (the key table's documented window)"
    )
    return Check("no guarded side effect happened twice", ok, detail), figures


def check_dead_letters_once(letters: list[tuple[str, str]]) -> tuple[Check, dict[str, Any]]:
    rows = collections.Counter(task_id for task_id, _ in letters)
    repeated = sorted(t for t, n in rows.items() if n > 1)
    reasons = collections.Counter(reason for _, reason in letters)
    detail = f"{len(letters)} rows, {len(rows)} task ids, {len(repeated)} with more than one row"
    return Check("each dead letter exactly once", not repeated, detail), {
        "rows": len(letters),
        "by_reason": dict(reasons),
        "repeated": repeated[:20],
    }


#: What may become of a job of each plan: success, or these dead-letter reasons.
#: ``worker_lost``: a killed pool process counts as an attempt, so kills can use up the
#: retries of a job that would have recovered.
ALLOWED = {
    "ok": (True, {"worker_lost"}),
    "transient": (True, {"worker_lost"}),
    "exhaust": (False, {"exhausted", "worker_lost"}),
    "permanent": (False, {"permanent"}),
    "charge": (True, {"worker_lost", "exhausted"}),
    "receipt": (True, {"worker_lost", "exhausted"}),
}


def check_outcomes(
    jobs: list[Job],
    ledger: Ledger,
    letters: list[tuple[str, str]],
    slots: SlotWatch,
    losses: ConnectionLosses,
    pops: PopClock,
) -> tuple[Check, dict[str, Any]]:
    reason_of = dict(letters)
    surprises: list[str] = []
    table: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for job in jobs:
        may_succeed, reasons = ALLOWED[job.plan]
        if job.task_id in ledger.ok:
            outcome, fine = "succeeded", may_succeed
        elif job.task_id in reason_of:
            outcome = reason_of[job.task_id]
            fine = outcome in reasons
        else:
            continue  # lost: reported by the accounting check
        table[job.plan][outcome] += 1
        if not fine:
            surprises.append(f"{job.task_id} ({job.plan}) {outcome}")
    ran = set(ledger.ticks)
    sent_not_run = sorted(slots.sent - ran)
    tick_queue = "fast"
    in_window = [
        slot
        for slot in sent_not_run
        if (at := _epoch(slot)) is not None
        and losses.overlap(tick_queue, *pops.popped_between(tick_queue, at))
    ]
    run_twice = sorted(s for s, ids in ledger.ticks.items() if len(ids) > 1)
    figures = {
        "by_plan": {plan: dict(c) for plan, c in sorted(table.items())},
        "surprises": surprises[:20],
        "beat_slots_sent": len(slots.sent | ran),
        "beat_slots_skipped": len(slots.skipped),
        "beat_slots_sent_not_run": sent_not_run[:20],
        "beat_slots_lost_in_a_kill_window": in_window[:20],
        "beat_slots_run_under_two_ids": run_twice[:20],
    }
    ok = not surprises and not sent_not_run and not run_twice
    detail = (
        f"{len(surprises)} jobs ended against their plan; beat: {figures['beat_slots_sent']} "
        f"slots sent, {len(sent_not_run)} not run ({len(in_window)} popped while the fast "
        f"worker's connection died), {len(run_twice)} run under two task ids"
    )
    return Check("every job ended as planned, every beat slot ran once", ok, detail), figures


def _epoch(slot: str) -> float | None:
    import datetime as dt

    try:
        return dt.datetime.fromisoformat(slot).timestamp()
    except ValueError:
        return None


# -- the run -----------------------------------------------------------------------------------


@dataclasses.dataclass
class Options:
    jobs: int
    rate: float
    fault_every: float
    seed: int
    drain_timeout: float
    results: Path
    broker: str = "redis"
    leader_kills: int = 1
    leader_down: float = LEADER_DOWN_S


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs to enqueue (>= 100)")
    parser.add_argument("--rate", type=float, default=60.0, help="jobs enqueued per second")
    parser.add_argument(
        "--fault-every",
        type=float,
        default=4.0,
        help="seconds between worker kills (alternately a whole worker and one pool process)",
    )
    parser.add_argument("--seed", type=int, default=None, help="workload and fault RNG seed")
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for every job to end after the last enqueue",
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="JSON figures file")
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="redis",
        help="redis: a private redis-server (restarted once); rabbitmq-cluster: a three-node "
        "RabbitMQ cluster of the soak's own whose fast-queue leader node is killed",
    )
    parser.add_argument(
        "--leader-kills",
        type=int,
        default=1,
        help="rabbitmq-cluster: SIGKILLs of the fast queue's leader node (each restarted)",
    )
    parser.add_argument(
        "--leader-down",
        type=float,
        default=LEADER_DOWN_S,
        help="rabbitmq-cluster: seconds a killed node stays down before its restart",
    )
    args = parser.parse_args(argv)
    if args.jobs < 100:
        parser.error("--jobs must be >= 100 (the faults need a run to land in)")
    if args.rate <= 0 or args.fault_every <= 0 or args.drain_timeout <= 0:
        parser.error("--rate, --fault-every and --drain-timeout must be > 0")
    if args.leader_kills < 1 or args.leader_down < 0:
        parser.error("--leader-kills must be >= 1 and --leader-down >= 0")
    if args.broker == "rabbitmq-cluster":
        from jobs_platform.testing.rabbitmq_cluster import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            parser.error(f"--broker rabbitmq-cluster: {reason}")
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    return Options(
        args.jobs,
        args.rate,
        args.fault_every,
        seed,
        args.drain_timeout,
        args.results,
        args.broker,
        args.leader_kills,
        args.leader_down,
    )


def worker_env(
    broker: dict[str, str], database_url: str, gateway_url: str, ledger: Path
) -> dict[str, str]:
    """``broker``: ``JOBS_BROKER_URL`` (and ``JOBS_COORDINATION_URL`` on RabbitMQ)."""
    return {
        "PYTHONPATH": str(ROOT),
        **broker,
        "JOBS_DATABASE_URL": database_url,
        "JOBS_VISIBILITY_TIMEOUT": str(VISIBILITY_TIMEOUT_S),
        "JOBS_VISIBILITY_MARGIN": str(VISIBILITY_MARGIN_S),
        # A killed worker's jobs come back one sweep after the visibility timeout.
        "JOBS_UNACKED_RESTORE_INTERVAL": "1",
        "JOBS_DLQ_DRAIN_INTERVAL": "1",
        # No Flower here: events would only cost worker CPU.
        "JOBS_TASK_EVENTS": "0",
        "CHAOS_LEDGER_DIR": str(ledger),
        "CHAOS_GATEWAY_URL": gateway_url,
    }


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C: the workers, the redis-server and
    # the database are stopped and dropped on the way out, never left behind.
    signal.signal(signal.SIGTERM, _interrupt)
    started = time.monotonic()
    print(
        f"chaos soak on {options.broker}: {options.jobs} jobs at {options.rate:g}/s, a fault "
        f"every {options.fault_every:g} s, seed {options.seed}",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        run_dir = Path(tempfile.mkdtemp(prefix="jobs-chaos-"))
        keep = stack.enter_context(_kept_on_failure(run_dir))
        report = _soak(options, stack, run_dir, started)
        keep.passed = report["passed"]
    return 0 if report["passed"] else 1


class _Keep:
    passed = False


@contextlib.contextmanager
def _kept_on_failure(run_dir: Path) -> Iterator[_Keep]:
    """The run directory (worker logs, ledger) is removed after a pass, kept after a failure."""
    keep = _Keep()
    try:
        yield keep
    finally:
        if keep.passed:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:
            print(f"worker logs and the ledger are kept in {run_dir}", flush=True)


def _soak(
    options: Options, stack: contextlib.ExitStack, run_dir: Path, started: float
) -> dict[str, Any]:
    rng = random.Random(options.seed)
    jobs, orders = plan_jobs(options.jobs, rng)
    ledger_dir = run_dir / "ledger"
    ledger_dir.mkdir()
    redis_server: RedisServer | None = None
    cluster: ClusterBroker | None = None
    if options.broker == "rabbitmq-cluster":
        print("starting a three-node RabbitMQ cluster of the soak's own", flush=True)
        cluster = ClusterBroker(stack)
        broker_env = cluster.env()
        print(
            f"cluster up in {cluster.start_s:.1f} s ({cluster.cluster.timings}); vhost "
            f"{cluster.vhost}",
            flush=True,
        )
    else:
        redis_server = stack.enter_context(RedisServer(persistent=True))
        broker_env = {"JOBS_BROKER_URL": redis_server.url}
    direct_url = stack.enter_context(private_database())
    proxy = stack.enter_context(TcpProxy("127.0.0.1", sa.make_url(direct_url).port or 5432))
    gateway = stack.enter_context(Gateway())
    env = worker_env(broker_env, through(direct_url, proxy.port), gateway.url, ledger_dir)
    os.environ.update(env)  # this process dispatches through the same app
    import bench.chaos_app as chaos_app
    from jobs_platform.db import upgrade

    upgrade(direct_url)
    _create_orders(direct_url, chaos_app.metadata, orders)
    fleet = Fleet(env, run_dir / "logs")
    stack.callback(fleet.stop)
    fleet.start()
    fleet.start_beat(1.0)
    app = chaos_app.app
    backlog_of: Callable[[], int]
    quiet_now: Callable[[], bool]
    if cluster is not None:
        from bench import chaos_cluster

        client = cluster.client()
        backlog_of = functools.partial(chaos_cluster.backlog, app)
        quiet_now = functools.partial(chaos_cluster.quiet, app, client)
    else:
        assert redis_server is not None
        client = redis.Redis.from_url(redis_server.url, socket_timeout=5, socket_connect_timeout=2)
        sublists = _queue_lists(app)
        backlog_of = functools.partial(backlog, client, sublists)
        quiet_now = functools.partial(quiet, client, sublists, app)
    stack.callback(client.close)
    slots = SlotWatch(chaos_app.BEAT_ENTRY)
    producer = Producer(chaos_app, backlog_of, options.rate)
    chaos = Chaos(
        fleet=fleet,
        redis_server=redis_server,
        proxy=proxy,
        gateway=gateway,
        every_s=options.fault_every,
        duration_s=options.jobs / options.rate,
        rng=rng,
        cluster=cluster,
        leader_kills=options.leader_kills,
        leader_down_s=options.leader_down,
    )
    print(f"fleet ready in {time.monotonic() - started:.1f} s; enqueueing", flush=True)
    enqueue_started = time.monotonic()
    chaos.start()
    try:
        producer.run(jobs, lambda i: _progress(i, len(jobs), client, slots))
    finally:
        faults = chaos.finish()
    enqueue_s = time.monotonic() - enqueue_started
    fleet.stop_beat()
    print(f"enqueued {len(jobs)} jobs in {enqueue_s:.1f} s; draining", flush=True)
    # On RabbitMQ running deliveries do not show over AMQP: "nothing ready anywhere" is
    # trusted with jobs still open only after longer than a job's hard limit (10 s).
    settle_polls = 2 if cluster is None else 15
    drain_s = _drain(
        options, jobs, ledger_dir, direct_url, client, quiet_now, fleet, slots, settle_polls
    )
    fleet.stop()
    slots.collect(client)
    report = _verdict(jobs, ledger_dir, direct_url, gateway, producer, slots, faults, fleet)
    if cluster is not None:
        report["figures"]["cluster"] = {
            "start_s": round(cluster.start_s, 1),
            "timings": str(cluster.cluster.timings),
        }
    report["figures"].update(
        broker=options.broker,
        seed=options.seed,
        rate=options.rate,
        fault_every_s=options.fault_every,
        wall_s=round(time.monotonic() - started, 1),
        enqueue_s=round(enqueue_s, 1),
        drain_s=round(drain_s, 1),
        proxy={"dropped_connections": proxy.dropped, "refused_connections": proxy.refused},
    )
    _print_report(report)
    options.results.parent.mkdir(parents=True, exist_ok=True)
    options.results.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def _create_orders(url: str, metadata: sa.MetaData, orders: dict[int, int]) -> None:
    engine = sa.create_engine(url)
    try:
        metadata.create_all(engine)
        if orders:
            table = metadata.tables["chaos_orders"]
            with engine.begin() as conn:
                conn.execute(
                    sa.insert(table),
                    [
                        {"id": order, "amount_cents": amount, "status": "open"}
                        for order, amount in orders.items()
                    ],
                )
    finally:
        engine.dispose()


def _progress(i: int, total: int, client: redis.Redis, slots: SlotWatch) -> None:
    if i % 500 == 0:
        slots.collect(client)
        print(f"  {i}/{total} enqueued", flush=True)


def _drain(
    options: Options,
    jobs: list[Job],
    ledger_dir: Path,
    direct_url: str,
    client: redis.Redis,
    quiet_now: Callable[[], bool],
    fleet: Fleet,
    slots: SlotWatch,
    settle_polls: int = 2,
) -> float:
    """Wait until every job has ended and nothing is left anywhere on the broker.

    Jobs still open once the broker has been quiet for two polls in a row are nowhere: not
    queued, held, delayed, spooled or running (a running job is unacknowledged). Waiting
    longer would not bring them back, so the drain ends and the verdict reports them.
    """
    started = time.monotonic()
    expected = {job.task_id for job in jobs}
    deadline = started + options.drain_timeout
    last_report = 0.0
    quiet_polls = 0
    while time.monotonic() < deadline:
        fleet.supervise()
        slots.collect(client)
        ledger = Ledger.read(ledger_dir)
        ended = ledger.ok | {task_id for task_id, _ in dead_letters(direct_url)}
        open_jobs = (expected | _tick_ids(ledger)) - ended
        quiet_polls = quiet_polls + 1 if quiet_now() else 0
        needed = settle_polls if open_jobs else 2
        if quiet_polls >= needed and (not open_jobs or all(fleet.ready(q) for q in QUEUE_NAMES)):
            if open_jobs:
                print(f"  the broker is empty and {len(open_jobs)} jobs never ended", flush=True)
            return time.monotonic() - started
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            print(f"  draining: {len(open_jobs)} jobs not ended yet", flush=True)
        time.sleep(1.0)
    print(f"drain timed out after {options.drain_timeout:g} s", flush=True)
    return time.monotonic() - started


def _tick_ids(ledger: Ledger) -> set[str]:
    return {task_id for ids in ledger.ticks.values() for task_id in ids}


def _tasks(chaos_app: Any) -> tuple[Any, ...]:
    return (chaos_app.work, chaos_app.crunch, chaos_app.charge, chaos_app.receipt, chaos_app.tick)


def _max_attempts() -> dict[str, int]:
    """Task name -> its most attempts (max_retries + 1), from the tasks themselves."""
    from bench import chaos_app

    return {task.name: int(task.max_retries) + 1 for task in _tasks(chaos_app)}


def _verdict(
    jobs: list[Job],
    ledger_dir: Path,
    direct_url: str,
    gateway: Gateway,
    producer: Producer,
    slots: SlotWatch,
    faults: Faults,
    fleet: Fleet,
) -> dict[str, Any]:
    from bench import chaos_app

    ledger = Ledger.read(ledger_dir)
    letters = dead_letters(direct_url)
    queue_of = {task.name: task.queue for task in _tasks(chaos_app)}
    expected = {job.task_id: queue_of[job.task] for job in jobs}
    expected |= {task_id: queue_of["chaos.tick"] for task_id in _tick_ids(ledger)}
    losses = ConnectionLosses(fleet.kill_windows)
    pops = PopClock(jobs, ledger, producer.sent_at, queue_of)
    results = [
        check_accounting(expected, ledger, letters, losses, pops, producer.sent_at),
        check_attempts(
            ledger,
            producer.redispatched,
            _max_attempts(),
            [float(k["killed_at"]) for k in faults.leader_kills],
        ),
        check_side_effects(jobs, ledger, gateway, paid_orders(direct_url), faults.db_cut_at),
        check_dead_letters_once(letters),
        check_outcomes(jobs, ledger, letters, slots, losses, pops),
    ]
    checks = [check for check, _ in results]
    _attribute_delayed_losses(results[0][1], jobs, ledger, letters, producer, faults, expected)
    figures: dict[str, Any] = {
        "jobs": len(jobs),
        "beat_runs": len(_tick_ids(ledger)),
        "plans": dict(collections.Counter(job.plan for job in jobs)),
        "delayed": {
            "short (Celery's path)": sum(1 for j in jobs if j.delay_s and j.delay_s < 10),
            "long (durable store)": sum(1 for j in jobs if j.delay_s and j.delay_s >= 10),
        },
        "faults": {
            "worker_kills": faults.worker_kills,
            "pool_process_kills": faults.child_kills,
            "pool_process_kills_during_a_job": faults.busy_child_kills,
            "pool_process_sigterms": faults.child_terms,
            "pool_process_sigterms_during_a_job": faults.busy_child_terms,
            "redis_restarts": faults.redis_restarts,
            "leader_kills": len(faults.leader_kills),
            "node_restarts": sum(1 for k in faults.leader_kills if k["restart_s"] is not None),
            "db_cuts": faults.db_cuts,
            "gateway_503s": faults.gateway_503s,
        },
        "worker_exits_not_caused_by_the_soak": len(fleet.unexpected_exits),
        "duplicates_absorbed": {
            "status_cas": ledger.dups["transition"],
            "key_table": ledger.dups["key"],
            "gateway_idempotency_key": gateway.replays,
        },
        "ledger_unreadable_lines": ledger.unreadable,
        "dispatch": {
            "refused": dict(producer.refused),
            "longest_stall_s": round(max((s for _, s in producer.stalls), default=0.0), 1),
        },
        "leader_kills": _leader_kills(faults, jobs, ledger, producer, expected),
        "fault_log": faults.log,
        "kill_windows": fleet.kill_windows,
        "child_kills": fleet.child_kills,
    }
    for name, (_, detail) in zip(
        ("accounting", "attempts", "side_effects", "dead_letters", "outcomes"),
        results,
        strict=True,
    ):
        figures[name] = detail
    return {
        "passed": all(check.ok for check in checks),
        "invariant": [check.line() for check in checks],
        "figures": figures,
        "unexpected_exits": fleet.unexpected_exits,
    }


def _attribute_delayed_losses(
    accounting: dict[str, Any],
    jobs: list[Job],
    ledger: Ledger,
    letters: list[tuple[str, str]],
    producer: Producer,
    faults: Faults,
    expected: dict[str, str],
) -> None:
    """On a cluster: how many lost jobs were last pushed as a delayed message around a
    leader kill (finding 5 in docs/chaos.md), and how many are lost otherwise."""
    from bench.chaos_cluster import lost_in_delayed_delivery

    if not faults.leader_kills:
        return
    lost = set(expected) - ledger.ok - {task_id for task_id, _ in letters}
    delay_of = {job.task_id: job.delay_s for job in jobs}

    def pushed_delayed(task_id: str) -> bool:
        # A run that did not succeed published a retry (with a countdown); no run: the
        # producer's dispatch, delayed or not.
        return bool(ledger.runs.get(task_id)) or bool(delay_of.get(task_id))

    in_delay = lost_in_delayed_delivery(
        lost,
        [float(k["killed_at"]) for k in faults.leader_kills],
        last_push=lambda t: last_push(t, ledger, producer.sent_at),
        pushed_delayed=pushed_delayed,
    )
    accounting["lost_in_delayed_delivery_at_a_leader_kill"] = in_delay[:50]
    accounting["lost_in_delayed_delivery_at_a_leader_kill_count"] = len(in_delay)
    accounting["lost_otherwise"] = sorted(lost - set(in_delay))[:50]
    accounting["lost_otherwise_count"] = len(lost - set(in_delay))


def _leader_kills(
    faults: Faults, jobs: list[Job], ledger: Ledger, producer: Producer, queue_of: dict[str, str]
) -> list[dict[str, Any]]:
    """Each leader kill's record with the resume time of each worker after it."""
    from bench.chaos_cluster import RESUME_BOUND_S

    undelayed = [job.task_id for job in jobs if not job.delay_s]
    out = []
    for kill in faults.leader_kills:
        resumed = resume_times(
            float(kill["killed_at"]),
            sent_at=producer.sent_at,
            queue_of_job=queue_of,
            undelayed=undelayed,
            runs=ledger.runs,
            ends=ledger.ends,
        )
        worst = [r["resumed_s"] for r in resumed.values()]
        out.append(
            {
                **kill,
                "resume": resumed,
                "resume_bound_s": RESUME_BOUND_S,
                "within_bound": all(w is not None and w <= RESUME_BOUND_S for w in worst),
            }
        )
    return out


def _print_report(report: dict[str, Any]) -> None:
    f = report["figures"]
    attempts, letters, faults = f["attempts"], f["dead_letters"], f["faults"]
    lines = [
        "",
        f"jobs: {f['jobs']} enqueued {f['plans']} + {f['beat_runs']} beat runs; "
        f"delayed {f['delayed']}",
        f"faults: {faults['worker_kills']} worker kills, {faults['pool_process_kills']} pool "
        f"process kills ({faults['pool_process_kills_during_a_job']} during a job), "
        f"{faults['pool_process_sigterms']} pool process SIGTERMs "
        f"({faults['pool_process_sigterms_during_a_job']} during a job), "
        + (
            f"{faults['redis_restarts']} redis restart, "
            if f.get("broker", "redis") == "redis"
            else f"{faults['leader_kills']} leader-node SIGKILLs ({faults['node_restarts']} "
            "restarted), "
        )
        + f"{faults['db_cuts']} "
        f"database cut, {faults['gateway_503s']} gateway 503s; "
        f"{f['worker_exits_not_caused_by_the_soak']} worker exits the soak did not cause",
        f"redeliveries: {attempts['redelivered_runs']} runs of redelivered messages "
        f"({attempts['redelivered_jobs']} jobs); {attempts['runs_beyond_retry_ladder']} runs "
        f"beyond a retry ladder; {attempts['retries_after_pool_process_killed']} retries after "
        f"a killed pool process; {attempts['redispatched_jobs']} jobs re-dispatched",
        f"duplicates absorbed: {f['duplicates_absorbed']}",
        f"dead letters by reason: {letters['by_reason']}",
        f"outcomes by plan: {f['outcomes']['by_plan']}",
        f"dispatch: refused and sent again {f['dispatch']['refused'] or 'never'}, longest "
        f"stall {f['dispatch']['longest_stall_s']} s",
        *(
            [
                f"lost: {f['accounting']['lost_count']}, of which "
                f"{f['accounting']['lost_in_delayed_delivery_at_a_leader_kill_count']} last "
                "pushed as a delayed message around a leader kill (finding 5), "
                f"{f['accounting']['lost_otherwise_count']} otherwise"
            ]
            if "lost_otherwise_count" in f["accounting"]
            else []
        ),
        *_leader_lines(f),
        f"wall time: {f['wall_s']} s (enqueue {f['enqueue_s']} s, drain {f['drain_s']} s)",
        "",
        *report["invariant"],
        f"RESULT: {'PASS' if report['passed'] else 'FAIL'}",
    ]
    for text in report["unexpected_exits"]:  # before the verdict, which ends the output
        lines.insert(-len(report["invariant"]) - 2, f"worker exited by itself: {text}")
    print("\n".join(lines), flush=True)


def _leader_lines(figures: dict[str, Any]) -> list[str]:
    lines = []
    if "cluster" in figures:
        lines.append(f"cluster: {figures['cluster']['timings']}")
    for i, kill in enumerate(figures["leader_kills"], 1):
        resumed = ", ".join(
            f"{queue} {r['resumed_s']} s (first run ended {r['first_run_end_s']} s)"
            for queue, r in kill["resume"].items()
        )
        lines.append(
            f"leader kill {i}: node {kill['node'].split('@')[0]}, new leader "
            f"{(kill['new_leader'] or '?').split('@')[0]} seen after {kill['new_leader_seen_s']} "
            f"s, restarted in {kill['restart_s']} s{'; ' + kill['error'] if kill['error'] else ''}"
        )
        lines.append(
            f"  resume time per worker (kill -> first job dispatched after it finished): "
            f"{resumed}; bound {kill['resume_bound_s']:g} s: "
            f"{'within' if kill['within_bound'] else 'EXCEEDED'}"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
