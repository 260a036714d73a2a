"""What a batch costs: ``python -m bench.batches``.

On a private redis-server and a fresh PostgreSQL database (``JOBS_TEST_PG``'s server), one
real worker (prefork -c 2, the ``fast`` queue) of ``bench/apps/batches.py``:

1. **CPU per member**: N no-op jobs dispatched with ``delay_many`` (the baseline) and the
   same N as one ``batch()`` with an ``on_complete`` callback, alternating, the order
   reversed every other round. CPU is the producer's (``time.process_time`` around the
   dispatch) plus the worker's process group (user + system from ``/proc``) from the
   dispatch to the last run (the batch: to its ``completed_at``), divided by N; the ratio
   is the median of the per-round ratios. Target: batch <= 1.3 x delay_many. The
   PostgreSQL server's own CPU is not counted (it is another process on the machine).
2. **A member's own path, in process**: the CPU of the worker's two batch calls (the
   cancel check before the body, the outcome after it: ``jobs_platform.batches.running``)
   for members of one open batch, called in a loop in this process (warm: the floor of
   what the worker adds per member, without the worker's scheduling around it).
3. **Creating a 100,000-member batch**: the wall time of ``batch()`` (checks, the batch
   row, the bulk publish) with no worker running, beside ``delay_many`` of the same calls.

Prints a summary and writes ``bench/results/batches.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from bench.apps.batches import RUNS_KEY, make
from bench.outbox import pg_database
from bench.throughput import ROOT, group_cpu_s
from jobs_platform import batch, db
from jobs_platform.batches import counting, marks, running
from jobs_platform.batches.model import batches, members
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for

TARGET_RATIO = 1.3


def settled(url: str, batch_id: str) -> bool:
    with db.engine_for(url).connect() as conn:
        return (
            conn.execute(sa.select(batches.c.completed_at).where(batches.c.id == batch_id)).scalar()
            is not None
        )


def one_round(app: Any, url: str, client: redis.Redis, pgid: int, n: int, kind: str) -> float:
    """CPU seconds per member of one round (producer + worker)."""
    noop = app.tasks["bench.batches.noop"]
    client.delete(RUNS_KEY)
    gc.collect()
    worker_before, producer_before = group_cpu_s(pgid), time.process_time()
    if kind == "delay_many":
        noop.delay_many([(i,) for i in range(n)])
        producer = time.process_time() - producer_before
        wait_for(lambda: int(client.get(RUNS_KEY) or 0) >= n, timeout_s=600, interval_s=0.05)
    else:
        made = batch(
            "bench", [noop.s(i) for i in range(n)], on_complete=app.tasks["bench.batches.done"].s()
        )
        producer = time.process_time() - producer_before
        wait_for(lambda: settled(url, made.id), timeout_s=600, interval_s=0.05)
    worker = group_cpu_s(pgid) - worker_before
    return (producer + worker) / n


def cpu_per_member(app: Any, url: str, server: RedisServer, n: int, rounds: int) -> dict[str, Any]:
    client = redis.Redis.from_url(server.url)
    env = {"BENCH_BROKER_URL": server.url, "JOBS_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    samples: dict[str, list[float]] = {"delay_many": [], "batch": []}
    ratios = []
    with WorkerProcess(
        "bench.apps.batches", ["fast"], env=env, cwd=str(ROOT), concurrency=2
    ) as worker:
        assert worker.process is not None
        pgid = worker.process.pid
        one_round(app, url, client, pgid, min(n, 200), "batch")  # warm-up: engines, imports
        one_round(app, url, client, pgid, min(n, 200), "delay_many")
        for index in range(rounds):
            order = ["delay_many", "batch"] if index % 2 == 0 else ["batch", "delay_many"]
            got = {kind: one_round(app, url, client, pgid, n, kind) for kind in order}
            for kind, value in got.items():
                samples[kind].append(value)
            ratios.append(got["batch"] / got["delay_many"])
    return {
        "members": n,
        "rounds": rounds,
        "cpu_us_per_member": {k: round(statistics.median(v) * 1e6) for k, v in samples.items()},
        "ratio": round(statistics.median(ratios), 3),
        "ratios": [round(r, 3) for r in ratios],
    }


def member_path(app: Any, url: str, n: int) -> dict[str, Any]:
    """CPU microseconds per member of the cancel check and of the outcome, in process."""
    noop = app.tasks["bench.batches.noop"]
    batch_id = str(uuid.uuid4())
    with db.engine_for(url).begin() as conn:
        counting.create(conn, batch_id, "member path", 2 * n + 2, {})
    marks.mark_open(app, batch_id)
    for i in range(n // 10):  # warm-up: connections, prepared statements
        running.before_body(noop, batch_id, f"w{i}")
        running.succeeded(noop, batch_id, f"w{i}")
    out = {}
    for name, call in (("check", running.before_body), ("outcome", running.succeeded)):
        started = time.process_time()
        for i in range(n):
            call(noop, batch_id, f"m{i}")
        out[f"{name}_us"] = round((time.process_time() - started) / n * 1e6)
    out["members"] = n
    return out


def creation(app: Any, url: str, server: RedisServer, n: int) -> dict[str, Any]:
    client = redis.Redis.from_url(server.url)
    noop = app.tasks["bench.batches.noop"]
    out = {}
    for kind in ("delay_many", "batch"):
        client.flushdb()
        gc.collect()
        started = time.perf_counter()
        if kind == "batch":
            batch("big", [noop.s(i) for i in range(n)])
        else:
            noop.delay_many([(i,) for i in range(n)])
        out[f"{kind}_s"] = round(time.perf_counter() - started, 2)
    client.flushdb()
    with db.engine_for(url).begin() as conn:
        conn.execute(sa.delete(members))
        conn.execute(sa.delete(batches))
    out["members"] = n
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    with RedisServer() as server, pg_database() as url:
        db.upgrade(url)
        app = make(server.url, url)
        cpu = cpu_per_member(app, url, server, args.members, args.rounds)
        path = member_path(app, url, args.members)
        created = creation(app, url, server, args.create)
    return {
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
        "cpu": cpu,
        "member_path": path,
        "create": created,
        "target_ratio": TARGET_RATIO,
        "met": cpu["ratio"] <= TARGET_RATIO,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--create", type=int, default=100_000)
    args = parser.parse_args(argv)
    result = run(args)
    out = Path(ROOT) / "bench" / "results" / "batches.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    cpu = result["cpu"]
    print(
        f"CPU per member (producer + worker): delay_many {cpu['cpu_us_per_member']['delay_many']}"
        f" us, batch {cpu['cpu_us_per_member']['batch']} us: {cpu['ratio']}x "
        f"(target <= {TARGET_RATIO}x: {'met' if result['met'] else 'MISSED'}); rounds "
        f"{cpu['ratios']}"
    )
    path = result["member_path"]
    print(
        f"a member's own path, in process: cancel check {path['check_us']} us, outcome "
        f"{path['outcome_us']} us CPU"
    )
    created = result["create"]
    print(
        f"creating {created['members']} members: batch {created['batch_s']} s, "
        f"delay_many {created['delay_many_s']} s"
    )
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
