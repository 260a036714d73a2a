"""A broker restart never leaves a worker deaf, and loses nothing (real workers, real Redis).

A private ``redis-server --appendonly yes --appendfsync always`` is restarted on the same
port and data, once with the workers idle (a clean restart) and once under load (SIGKILL
while jobs are being sent, queued and run, one long job running on each worker). One
worker per queue, each started as its ``worker-profile`` starts it (a smaller pool).

- Every worker runs a job sent after the restart within ``RESUME_BOUND_S`` of the broker
  answering again (docs/operations.md, "Broker restarts").
- Every job whose dispatch returned finishes or is a dead letter: one fetched and not
  acknowledged when the connection died comes back once the lease of the channel that
  held it runs out (jobs_platform/brokers/redis/liveness.py), not after the visibility
  timeout; only jobs in flight at the crash may run twice.
- Then the real ``celery -A APP health`` passes: its canary is what notices a worker that
  is alive and answers pings but consumes nothing (Celery's known failure after a
  reconnect; docs/health.md).

Under load the producer pauses until the queues are empty just before the crash: a message
Redis pops for a consumer in the instant its connection dies is lost by kombu's Redis
transport (BRPOP, then the ``unacked`` write: the handover window in docs/chaos.md), a
separate limit this test does not measure.

Redis-only: the RabbitMQ node is the machine's and is never restarted by a test. Its
connection-loss form (``rabbitmqctl close_all_connections -p VHOST`` while jobs run: they
come back and finish, a guarded side effect once) is in test_rabbitmq_operations.py; a node
killed under load, in the three-node cluster tests.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform.errors import DispatchError
from jobs_platform.routing import QUEUE_NAMES
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for, workers
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

APP = "tests.support.poison_app"
#: How soon after the broker answers again every worker runs a new job (docs/operations.md,
#: "Broker restarts"): Celery's first reconnect attempt is immediate, the next ones 2, 4,
#: 6 ... s apart, so a restart of a few seconds is caught by the attempt 2 s after it.
RESUME_BOUND_S = 10.0
#: The fault injected under load: how long the broker stays down after the SIGKILL.
OUTAGE_S = 2.0
#: Jobs sent under load (a third per queue), at about SEND_RATE per second: busy workers
#: that still have a free slot most of the time (a saturated one leaves a popped message
#: unread in its socket, kombu's handover window: docs/chaos.md).
LOAD_JOBS = 240
SEND_RATE = 60.0
CONCURRENCY = {"fast": 2, "heavy": 2, "thirdparty": 4}
HEALTH_CHECKS = (
    "--check",
    "broker",
    "--check",
    "consumers",
    "--check",
    "canary",
    "--timeout",
    "10",
)


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(persistent=True) as private:
        yield private


@pytest.fixture(scope="module")
def env(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    database = tmp_path_factory.mktemp("restartdb") / "jobs.sqlite3"
    return {
        "JOBS_BROKER_URL": server.url,
        "JOBS_DATABASE_URL": f"sqlite:///{database}",
        "PYTHONPATH": str(ROOT),
    }


@pytest.fixture(scope="module")
def app_module(env: dict[str, str]) -> Iterator[Any]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        from tests.support import poison_app

        module = importlib.reload(poison_app)  # built from this module's environment
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield module
    gc.collect()
    consumer = getattr(module.app.backend, "result_consumer", None)
    if consumer is not None:
        consumer.subscribed_to.clear()
        consumer.stop()


@pytest.fixture(scope="module")
def stack(
    env: dict[str, str], app_module: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, WorkerProcess]]:
    logs = str(tmp_path_factory.mktemp("restartw"))
    procs = {
        queue: WorkerProcess.for_profile(
            APP, queue, concurrency=CONCURRENCY[queue], env=env, cwd=ROOT, log_dir=logs
        )
        for queue in QUEUE_NAMES
    }
    with workers(*procs.values()):
        yield procs


@pytest.fixture()
def raw(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    yield client
    client.close()


# -- helpers --------------------------------------------------------------------------------


def restart(server: RedisServer, *, crash: bool, outage_s: float = 0.0) -> float:
    """Stop the broker (SIGKILL with ``crash``, else a clean shutdown) and start it again on
    the same port and data after ``outage_s``; the wall-clock time it answered again."""
    assert server.process is not None
    if crash:
        server.process.kill()
        server.process.wait(10)
        server.process = None
    else:
        server.stop()
    time.sleep(outage_s)  # the fault itself: the broker is down this long
    server.start()
    client = redis.Redis.from_url(server.url)
    wait_for(lambda: client.ping(), timeout_s=10, message="the broker to load its data")
    client.close()
    return time.time()


def runs(raw: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(entry) for entry in raw.lrange(f"jptest:runs:{key}", 0, -1)]


def health(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "health", *HEALTH_CHECKS],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def resumed_after(
    app_module: Any, raw: redis.Redis, env: dict[str, str], up: float
) -> dict[str, float]:
    """Seconds from the broker answering to each queue's worker running a job sent then.

    A worker that does not within the bound fails the test, with what ``health`` said.
    """
    keys = {queue: uuid.uuid4().hex for queue in QUEUE_NAMES}
    for queue, key in keys.items():
        wait_for(  # the producer's own connection may need a moment to come back too
            lambda q=queue, k=key: _send(app_module, q, k),
            timeout_s=RESUME_BOUND_S,
            message=f"a {queue} job to be accepted",
        )
    resumed = {}
    for queue, key in keys.items():
        try:
            [run] = wait_for(
                lambda k=key: runs(raw, k), timeout_s=RESUME_BOUND_S, message=f"{queue} to run"
            )
        except TimeoutError:
            report = health(env)
            pytest.fail(
                f"the {queue} worker did not consume within {RESUME_BOUND_S} s of the restart; "
                f"health exited {report.returncode}:\n{report.stdout}{report.stderr}"
            )
        resumed[queue] = round(run["t"] - up, 2)
    return resumed


def _send(app_module: Any, queue: str, key: str, sleep_s: float = 0.0) -> str | None:
    """The task id, or None when dispatch refused (the broker did not answer)."""
    task = app_module.BY_QUEUE[queue]
    try:
        # No result wanted: nothing subscribes to a result channel the crash would break.
        return str(task.apply_async((key,), {"sleep_s": sleep_s}, ignore_result=True).id)
    except DispatchError:
        return None


# -- tests ----------------------------------------------------------------------------------


def test_idle_workers_resume_consuming_after_a_broker_restart(
    server: RedisServer,
    stack: dict[str, WorkerProcess],
    app_module: Any,
    raw: redis.Redis,
    env: dict[str, str],
) -> None:
    before = resumed_after(app_module, raw, env, time.time())  # all consuming to begin with
    assert set(before) == set(QUEUE_NAMES)
    up = restart(server, crash=False)
    resumed = resumed_after(app_module, raw, env, up)
    print(f"\nidle restart: resumed after {resumed} s")

    assert all(worker.alive for worker in stack.values())
    report = health(env)
    assert report.returncode == 0, report.stdout + report.stderr


#: How long the jobs running through a connection blip sleep: still running when it hits.
BLIP_JOB_S = 4.0
#: A held job runs again within the worker lease (15 s) + a restore interval (5 s) + its
#: lost attempt's retry wait, with slack for a loaded machine (the promise is 30 s).
LEASE_BOUND_S = 40.0


def test_jobs_running_through_a_connection_blip_are_redelivered_not_lost(
    stack: dict[str, WorkerProcess],
    app_module: Any,
    raw: redis.Redis,
    env: dict[str, str],
) -> None:
    """Redis stays up and drops every client connection (``CLIENT KILL``). Celery cancels
    the job running on each worker (prefork kills the child, gevent the greenlet); the
    message must stay unacknowledged (not be acknowledged as a revoke or, on gevent, as the
    killed greenlet's "success"), so that the job comes back and finishes."""
    jobs = {f"blip-{q}-{uuid.uuid4().hex[:6]}": q for q in QUEUE_NAMES}
    ids = {}
    for key, queue in jobs.items():
        task_id = _send(app_module, queue, key, sleep_s=BLIP_JOB_S)
        assert task_id is not None
        ids[key] = task_id
    wait_for(
        lambda: all(raw.exists(f"jptest:runs:{k}") for k in jobs),
        timeout_s=30,
        message="a job running on each worker",
    )
    dropped = raw.client_kill_filter(_type="normal")  # every connection but this one
    # Each worker consumes again, so it has been through its connection-loss handling.
    resumed = resumed_after(app_module, raw, env, time.time())

    # A job whose message its old channel still held comes back when that channel's lease
    # runs out (15 s, checked every 5 s): no waiting for the visibility timeout (an hour).
    cut = time.time()
    try:
        wait_for(
            lambda: all(raw.exists(f"jptest:done:{k}") for k in jobs),
            timeout_s=BLIP_JOB_S + LEASE_BOUND_S,
            message="every blip job to run again and finish",
        )
    except TimeoutError:
        unfinished = {k: len(runs(raw, k)) for k in jobs if not raw.exists(f"jptest:done:{k}")}
        held = set(unacked_ids(raw).values())
        pytest.fail(
            f"blip jobs not run again (key: runs): {unfinished}; still held in unacked: "
            f"{[k for k, t in ids.items() if t in held]}"
        )
    how = {k: round(runs(raw, k)[-1]["t"] - cut, 1) for k in jobs}
    starts = {k: len(runs(raw, k)) for k in jobs}
    print(
        f"\nblip: {dropped} connections dropped; resumed after {resumed} s; last runs began "
        f"{how} s after the cut; runs per job {starts}"
    )
    assert all(n >= 2 for n in starts.values()), starts  # each was cancelled, then re-run
    assert all(worker.alive for worker in stack.values())


class Producer(threading.Thread):
    """Sends LOAD_JOBS jobs round-robin over the queues at about SEND_RATE per second,
    waiting while ``go`` is clear."""

    def __init__(self, app_module: Any) -> None:
        super().__init__(daemon=True)
        self.app_module = app_module
        self.go = threading.Event()
        self.go.set()
        self.accepted: dict[str, str] = {}  # key -> task id: dispatch returned
        self.refused = 0  # DispatchError: the caller knows it was not sent

    def run(self) -> None:
        for i in range(LOAD_JOBS):
            self.go.wait()
            key = f"load-{i}-{uuid.uuid4().hex[:6]}"
            task_id = _send(self.app_module, QUEUE_NAMES[i % len(QUEUE_NAMES)], key)
            if task_id is None:
                self.refused += 1
            else:
                self.accepted[key] = task_id
            time.sleep(1 / SEND_RATE)


def queued(raw: redis.Redis) -> int:
    """Messages waiting in the queues (each queue's priority lists included)."""
    lists = [
        q + suffix for q in QUEUE_NAMES for suffix in ("", "\x06\x163", "\x06\x166", "\x06\x169")
    ]
    return sum(raw.llen(name) for name in lists)


def unacked_ids(raw: redis.Redis) -> dict[str, str]:
    """Delivery tag -> task id of the messages in kombu's ``unacked`` hash."""
    return {
        str(tag): str((json.loads(value)[0].get("headers") or {}).get("id"))
        for tag, value in raw.hgetall("unacked").items()
    }


def held_unacked(raw: redis.Redis) -> set[str]:
    """Task ids of messages a worker fetched and did not acknowledge: a channel the
    connection loss closed holds them until its lease runs out."""
    return set(unacked_ids(raw).values())


def first_start_after(
    starts: dict[str, list[dict[str, Any]]], host: str, up: float
) -> float | None:
    times = [r["t"] for rs in starts.values() for r in rs if r["host"] == host and r["t"] >= up]
    return round(min(times) - up, 2) if times else None


def test_workers_under_load_resume_after_a_broker_crash_and_no_job_is_lost(
    server: RedisServer,
    stack: dict[str, WorkerProcess],
    app_module: Any,
    raw: redis.Redis,
    env: dict[str, str],
) -> None:
    from jobs_platform.deadletter.store import DeadLetterStore

    producer = Producer(app_module)
    producer.start()
    wait_for(lambda: len(producer.accepted) >= LOAD_JOBS // 3, timeout_s=30, message="load")
    # One long job running on each worker when the broker dies.
    long_jobs = {f"long-{q}-{uuid.uuid4().hex[:6]}": q for q in QUEUE_NAMES}
    for key, queue in long_jobs.items():
        task_id = _send(app_module, queue, key, sleep_s=OUTAGE_S + 3)
        assert task_id is not None
        producer.accepted[key] = task_id
    wait_for(lambda: all(raw.exists(f"jptest:runs:{k}") for k in long_jobs), timeout_s=30)
    producer.go.clear()  # outside kombu's handover window (module docstring)
    wait_for(lambda: queued(raw) == 0, timeout_s=30, message="the queues to drain")
    up = restart(server, crash=True, outage_s=OUTAGE_S)
    producer.go.set()
    producer.join(60)
    assert not producer.is_alive()
    store = DeadLetterStore(env["JOBS_DATABASE_URL"])

    def accounted() -> Accounting | None:
        """Every accepted job finished or died (a dead letter), and the queues are empty;
        else None (keep waiting: a held job comes back within its channel's lease)."""
        tally = Accounting.of(raw, producer.accepted, store)
        return tally if not tally.lost and not tally.held and not queued(raw) else None

    try:
        tally = wait_for(
            accounted, timeout_s=LEASE_BOUND_S + 15, interval_s=0.5, message="every job accounted"
        )
    except TimeoutError:
        tally = Accounting.of(raw, producer.accepted, store)
        waiting = {q: raw.llen(q) for q in QUEUE_NAMES}
        report = health(env)
        pytest.fail(
            f"jobs lost after a broker crash: {tally}; still queued {waiting}; health exited "
            f"{report.returncode}:\n{report.stdout}{report.stderr}"
        )
    resumed = {q: first_start_after(tally.starts, w.hostname, up) for q, w in stack.items()}
    print(
        f"\nunder load: {len(producer.accepted)} accepted, {producer.refused} refused at "
        f"dispatch; {tally}; resumed after {resumed} s"
    )
    assert len(producer.accepted) + producer.refused == LOAD_JOBS + len(long_jobs)
    assert all(worker.alive for worker in stack.values())
    # At least once: only what was in flight at the crash may run twice (each worker holds
    # at most its concurrency, prefetch 1); held jobs came back within their lease.
    in_flight = sum(CONCURRENCY.values()) + 1  # + a publish whose reply the crash cut
    assert len(tally.twice) <= in_flight and not tally.held, tally
    back = [round(r[1]["t"] - up, 1) for k in long_jobs if len(r := tally.starts[k]) > 1]
    print(f"held long jobs ran again {back} s after the broker answered")
    assert all(seconds <= LEASE_BOUND_S for seconds in back), back
    # Each worker started jobs fetched after the restart, and runs a new one now.
    assert all(seconds is not None for seconds in resumed.values()), resumed
    assert set(resumed_after(app_module, raw, env, time.time())) == set(QUEUE_NAMES)
    report = health(env)
    assert report.returncode == 0, report.stdout + report.stderr


@dataclasses.dataclass
class Accounting:
    """What became of each accepted job (by key), from the broker and the dead-letter table."""

    starts: dict[str, list[dict[str, Any]]]
    finished: list[str]
    twice: list[str]
    dead: list[str]
    held: list[str]
    lost: list[str]

    @classmethod
    def of(cls, raw: redis.Redis, accepted: dict[str, str], store: Any) -> Accounting:
        with raw.pipeline(transaction=False) as pipe:
            for key in accepted:
                pipe.lrange(f"jptest:runs:{key}", 0, -1)
                pipe.exists(f"jptest:done:{key}")
            found = pipe.execute()
        starts = {k: [json.loads(e) for e in found[2 * i]] for i, k in enumerate(accepted)}
        finished = [k for i, k in enumerate(accepted) if found[2 * i + 1]]
        unfinished = [k for k in accepted if k not in set(finished)]
        dead = [k for k in unfinished if store.by_task_id(accepted[k])]
        unacked = held_unacked(raw)
        held = [k for k in unfinished if k not in dead and accepted[k] in unacked]
        return cls(
            starts=starts,
            finished=finished,
            twice=[k for k, runs in starts.items() if len(runs) > 1],
            dead=dead,
            held=held,
            lost=[k for k in unfinished if k not in dead and k not in held],
        )

    def __str__(self) -> str:
        lost = {k: len(self.starts[k]) for k in self.lost[:5]}
        return (
            f"{len(self.finished)} finished ({len(self.twice)} started twice), "
            f"{len(self.dead)} dead-lettered, {len(self.held)} still held, "
            f"{len(self.lost)} lost (key: starts) {lost}"
        )
