"""What dispatching with the transaction costs: ``python -m bench.outbox``.

On a private redis-server and a fresh PostgreSQL database (``JOBS_TEST_PG``'s server):

1. **Producer cost per job**, one process, a transaction per job (a web request placing
   one order): bare Celery ``delay()``; ``ReliableTask.delay()``; an order row committed,
   then ``delay()`` (what an app writes without the outbox: a crash between the two loses
   the job); an order row plus ``delay_on_commit`` in one transaction. Median of rounds,
   microseconds per job (wall and the producer's CPU).
2. **End-to-end latency**, with a real worker (``fast`` profile, its relay at the default
   ``JOBS_OUTBOX_RELAY_INTERVAL``): jobs placed one at a time, from the start of the
   request to the task's start (both stamped with this machine's clock), ``delay()`` after
   the commit vs ``delay_on_commit``.
3. **Relay throughput**: N committed rows published by one relay, then by two racing
   (threads, an engine each), on PostgreSQL and SQLite; beside ``delay_many`` of the same
   jobs (the bulk publish the relay uses, without the database). Target: one relay on
   PostgreSQL >= 2,000 jobs/s.

Prints a summary and writes ``bench/results/outbox.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import celery
import redis
import sqlalchemy as sa
from sqlalchemy.orm import Session

from bench.apps.outbox import LATENCIES_KEY, producer
from jobs_platform import db
from jobs_platform.outbox.model import job_outbox
from jobs_platform.outbox.relay import relay_once
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = os.environ.get(
    "JOBS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
TARGET_RELAY_PER_S = 2000.0
orders = sa.Table(
    "bench_orders",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("amount_cents", sa.Integer, nullable=False),
)


@contextlib.contextmanager
def pg_database() -> Iterator[str]:
    name = f"jobs_bench_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def prepare(url: str) -> None:
    db.upgrade(url)
    orders.metadata.create_all(db.engine_for(url))


def clear(url: str, client: redis.Redis) -> None:
    with db.engine_for(url).begin() as conn:
        conn.execute(sa.delete(job_outbox))
        conn.execute(sa.delete(orders))
    client.delete("fast", "celery")
    gc.collect()  # AsyncResults unsubscribe when collected: not inside the next timing


# -- 1. producer cost --------------------------------------------------------------------------


def producer_variants(task: Any, bare: Any, url: str) -> dict[str, Callable[[int], None]]:
    engine = db.engine_for(url)

    def order_then_delay(i: int) -> None:
        with Session(engine) as session:
            session.execute(sa.insert(orders).values(amount_cents=i))
            session.commit()
        task.delay("delay", time.time())

    def order_with_delay_on_commit(i: int) -> None:
        with Session(engine) as session:
            session.execute(sa.insert(orders).values(amount_cents=i))
            task.delay_on_commit(session, "on_commit", time.time())
            session.commit()

    return {
        "bare_delay": lambda i: bare.delay("bare", time.time()),
        "delay": lambda i: task.delay("delay", time.time()),
        "order_commit_then_delay": order_then_delay,
        "order_and_delay_on_commit": order_with_delay_on_commit,
    }


def producer_cost(
    task: Any, bare: Any, url: str, client: redis.Redis, n: int, rounds: int
) -> dict[str, Any]:
    variants = producer_variants(task, bare, url)
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for index in range(rounds + 1):  # round 0 warms up
        keys = list(variants) if index % 2 else list(reversed(variants))
        for key in keys:
            clear(url, client)
            run = variants[key]
            count = n if index else min(n, 200)
            started_cpu, started = time.process_time(), time.perf_counter()
            for i in range(count):
                run(i)
            if index:
                wall[key].append((time.perf_counter() - started) / count * 1e6)
                cpu[key].append((time.process_time() - started_cpu) / count * 1e6)
    clear(url, client)
    return {
        "wall_us_per_job": {k: round(statistics.median(v)) for k, v in wall.items()},
        "cpu_us_per_job": {k: round(statistics.median(v)) for k, v in cpu.items()},
    }


# -- 2. end-to-end latency ---------------------------------------------------------------------


def latency(
    task: Any, url: str, server: RedisServer, client: redis.Redis, jobs: int
) -> dict[str, Any]:
    env = {
        "BENCH_BROKER_URL": server.url,
        "JOBS_DATABASE_URL": url,
        "PYTHONPATH": str(ROOT),
    }
    variants = producer_variants(task, None, url)
    out: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as logs,
        WorkerProcess("bench.apps.outbox", ["fast"], env=env, cwd=str(ROOT), log_dir=logs),
    ):
        for variant, run, label in (
            ("delay", variants["order_commit_then_delay"], "order_commit_then_delay"),
            ("on_commit", variants["order_and_delay_on_commit"], "order_and_delay_on_commit"),
        ):
            key = LATENCIES_KEY.format(variant=variant)
            client.delete(key)
            for i in range(jobs):
                run(i)
                time.sleep(0.02)  # one at a time: latency, not a queue's backlog
            wait_for(lambda k=key: client.llen(k) >= jobs, timeout_s=120, interval_s=0.2)
            ms = sorted(float(x) * 1000 for x in client.lrange(key, 0, -1))
            out[label] = {
                "p50_ms": round(statistics.median(ms), 1),
                "p95_ms": round(ms[int(len(ms) * 0.95) - 1], 1),
                "max_ms": round(ms[-1], 1),
            }
    clear(url, client)
    return out


# -- 3. relay throughput -----------------------------------------------------------------------


def commit_rows(task: Any, url: str, n: int) -> None:
    with Session(db.engine_for(url)) as session:
        for i in range(n):
            task.delay_on_commit(session, "relay", float(i))
        session.commit()


def relay_all(task: Any, url: str, relays: int) -> float:
    """Seconds for ``relays`` relays (an engine each) to publish every committed row."""
    barrier = threading.Barrier(relays + 1)
    sent = [0] * relays
    args = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}

    def relay(index: int) -> None:
        engine = sa.create_engine(url, **args)
        barrier.wait()
        while done := relay_once(task.app, limit=500, engine=engine):
            sent[index] += done
        engine.dispose()

    threads = [threading.Thread(target=relay, args=(i,)) for i in range(relays)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def relay_throughput(
    task: Any, url: str, client: redis.Redis, n: int, rounds: int
) -> dict[str, float]:
    rates: dict[str, list[float]] = {"one_relay": [], "two_relays": [], "delay_many": []}
    for _ in range(rounds):
        for key, relays in (("one_relay", 1), ("two_relays", 2)):
            clear(url, client)
            commit_rows(task, url, n)
            elapsed = relay_all(task, url, relays)
            queued = client.llen("fast")
            if queued != n:
                raise RuntimeError(f"{key}: {queued} messages queued, not {n}")
            rates[key].append(n / elapsed)
        clear(url, client)
        started = time.perf_counter()
        task.delay_many(("relay", float(i)) for i in range(n))
        rates["delay_many"].append(n / (time.perf_counter() - started))
    clear(url, client)
    return {k: round(statistics.median(v)) for k, v in rates.items()}


# -- the run -----------------------------------------------------------------------------------


def bare_task(url: str) -> Any:
    app = celery.Celery("bench-bare-outbox", broker=url, set_as_current=False)

    @app.task(name="bench.bare_touch", shared=False)
    def touch(variant: str, called_at: float) -> None: ...

    return touch


def run(n: int, rounds: int, relay_rows: int, latency_jobs: int) -> dict[str, Any]:
    with RedisServer() as server, pg_database() as pg, tempfile.TemporaryDirectory() as tmp:
        client = redis.Redis.from_url(server.url)
        prepare(pg)
        task = producer(server.url, pg)
        print("producer cost...", flush=True)
        cost = producer_cost(task, bare_task(server.url), pg, client, n, rounds)
        print("end-to-end latency (a real worker)...", flush=True)
        lat = latency(task, pg, server, client, latency_jobs)
        print("relay throughput, PostgreSQL...", flush=True)
        relay_pg = relay_throughput(task, pg, client, relay_rows, rounds)
        sqlite = f"sqlite:///{tmp}/outbox.sqlite3"
        prepare(sqlite)
        print("relay throughput, SQLite...", flush=True)
        relay_sqlite = relay_throughput(producer(server.url, sqlite), sqlite, client, relay_rows, 1)
        client.close()
        db.engine_for(pg).dispose()
    return {
        "benchmark": "outbox",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {
            "producer_jobs": n,
            "rounds": rounds,
            "relay_rows": relay_rows,
            "latency_jobs": latency_jobs,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "celery": celery.__version__,
            "loadavg_end": os.getloadavg(),
        },
        "producer": cost,
        "latency": lat,
        "relay_jobs_per_s": {"postgresql": relay_pg, "sqlite": relay_sqlite},
        "target": {"one_relay_postgresql_jobs_per_s": TARGET_RELAY_PER_S},
        "met": relay_pg["one_relay"] >= TARGET_RELAY_PER_S,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=2000, help="per producer variant and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--relay-rows", type=int, default=20_000)
    p.add_argument("--latency-jobs", type=int, default=100)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "outbox.json"))
    args = p.parse_args(argv)
    result = run(args.jobs, args.rounds, args.relay_rows, args.latency_jobs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    wall, cpu = result["producer"]["wall_us_per_job"], result["producer"]["cpu_us_per_job"]
    lines = [f"outbox (PostgreSQL, median of {args.rounds} rounds):", "  producer, per job:"]
    for key in wall:
        lines.append(f"    {key:<28} {wall[key]:>6} us wall, {cpu[key]:>6} us CPU")
    ratio = wall["order_and_delay_on_commit"] / wall["order_commit_then_delay"]
    lines.append(f"    on commit / commit then delay() = {ratio:.2f}x")
    lines.append("  call to task start (a real worker):")
    for key, figures in result["latency"].items():
        lines.append(
            f"    {key:<28} p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, "
            f"max {figures['max_ms']} ms"
        )
    lines.append(f"  relay, {args.relay_rows:,} committed rows:")
    for backend, rates in result["relay_jobs_per_s"].items():
        lines.append(
            f"    {backend:<10} one relay {rates['one_relay']:>6,}/s, two relays "
            f"{rates['two_relays']:>6,}/s (delay_many {rates['delay_many']:,}/s)"
        )
    verdict = "met" if result["met"] else "MISSED"
    lines.append(f"  target one relay on PostgreSQL >= {TARGET_RELAY_PER_S:,.0f}/s: {verdict}")
    lines.append(f"  written to {out}")
    print("\n".join(lines))
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
