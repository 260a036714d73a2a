"""How fast due jobs leave the delayed store: ``python -m bench.delayed``.

On a private redis-server, the store is filled with N jobs (default 10,000) whose payload
is a real one (a task message stored by the platform's transport, cloned with fresh ids):

* throughput: all N already due, 1 and 2 releaser processes move them to their queues;
  jobs/s from the first script run to the store being empty (target >= 5,000/s);
* lateness: all N due at the same moment, 2 releaser processes polling every
  ``--interval`` s as workers do; per job, how long after its due time the release script
  moved it (Redis clock), p50/p99/max (target p99 < 1 s);
* memory: Redis ``used_memory`` per stored job.

Prints a summary and writes ``bench/results/delayed.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from jobs_platform.brokers.redis.delayed import DelayedJob, Keys, count, release_due, store_args
from jobs_platform.settings import Settings
from jobs_platform.testing import RedisServer

ROOT = Path(__file__).resolve().parents[1]
KEYS = Keys("bench:delayed")
TARGET_JOBS_PER_S = 5000.0
TARGET_P99_MS = 1000.0


def template_job(url: str) -> DelayedJob:
    """One job stored by the real transport (a task with two arguments and a time limit)."""
    from jobs_platform import create_app
    from jobs_platform.brokers.redis.options import PREFIX

    app = create_app("bench-delayed", broker_url=url)
    app.conf.broker_transport_options = {**app.conf.broker_transport_options, PREFIX: KEYS.prefix}

    @app.task(name="bench.remind_customer", time_limit=30)
    def remind_customer(customer_id: int, template: str) -> None:
        """Never runs: only its message is used."""

    sent = remind_customer.apply_async(
        (123456, "renewal-reminder"), countdown=3600, priority=6, ignore_result=True
    )
    client = redis.Redis.from_url(url)
    raw = client.hget(KEYS.jobs, sent.id)
    assert raw is not None, "the transport did not store the job"
    client.delete(KEYS.due, KEYS.jobs)
    return DelayedJob.from_json(raw)


def fill(client: redis.Redis, template: DelayedJob, n: int, due_ms: int) -> None:
    with client.pipeline(transaction=False) as pipe:
        for i in range(n):
            task_id = f"bench-{i:07d}"
            job = dataclasses.replace(
                template,
                id=task_id,
                payload=template.payload.replace(template.id, task_id),
                due=due_ms,
            )
            pipe.eval(*store_args(KEYS, job))
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def releasers(url: str, n: int, interval: float) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.delayed", "--releaser", url, "--interval", str(interval)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(n)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return procs


def go(procs: list[subprocess.Popen[str]]) -> list[list[int]]:
    """Start the releasers together; each one's lateness list (ms) when the store is empty."""
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return [json.loads(proc.communicate(timeout=300)[0]) for proc in procs]


def releaser_main(url: str, interval: float) -> None:
    """A releaser process: after "go", a pass every ``interval`` s (0: back to back) until
    the store is empty; prints the lateness of every job it moved."""
    client = redis.Redis.from_url(url)
    print("ready", flush=True)
    sys.stdin.readline()
    lateness: list[int] = []
    while True:
        lateness.extend(release_due(client, KEYS).lateness_ms)
        if not count(client, KEYS):
            break
        if interval:
            time.sleep(interval)
    print(json.dumps(lateness), flush=True)


def throughput(client: redis.Redis, url: str, template: DelayedJob, n: int, procs: int) -> float:
    client.flushdb()
    fill(client, template, n, server_ms(client) - 1000)
    started = releasers(url, procs, 0.0)
    begin = time.perf_counter()
    moved = sum(len(lat) for lat in go(started))
    elapsed = time.perf_counter() - begin
    assert moved == n, f"moved {moved} of {n}"
    return n / elapsed


def lateness(
    client: redis.Redis, url: str, template: DelayedJob, n: int, interval: float
) -> list[int]:
    client.flushdb()
    started = releasers(url, 2, interval)
    due = server_ms(client) + 3000
    fill(client, template, n, due)
    assert server_ms(client) < due, "filling took longer than the lead time"
    out = sorted(ms for lat in go(started) for ms in lat)
    assert len(out) == n, f"released {len(out)} of {n}"
    return out


def bytes_per_job(client: redis.Redis, template: DelayedJob, n: int) -> float:
    client.flushdb()
    before = int(client.info("memory")["used_memory"])
    fill(client, template, n, server_ms(client) + 3_600_000)
    return (int(client.info("memory")["used_memory"]) - before) / n


def percentile(values: list[int], p: float) -> int:
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def run(n: int, interval: float) -> dict[str, Any]:
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        template = template_job(server.url)
        one = throughput(client, server.url, template, n, 1)
        two = throughput(client, server.url, template, n, 2)
        late = lateness(client, server.url, template, n, interval)
        memory = bytes_per_job(client, template, n)
        client.close()
    result: dict[str, Any] = {
        "jobs": n,
        "payload_bytes": len(template.payload.encode()),
        "release_interval_s": interval,
        "throughput_jobs_per_s": {"one_releaser": round(one), "two_releasers": round(two)},
        "lateness_ms": {
            "p50": percentile(late, 50),
            "p99": percentile(late, 99),
            "max": late[-1],
            "mean": round(statistics.fmean(late), 1),
        },
        "redis_bytes_per_job": round(memory),
        "targets": {"throughput_jobs_per_s": TARGET_JOBS_PER_S, "lateness_p99_ms": TARGET_P99_MS},
    }
    result["met"] = {
        "throughput": min(one, two) >= TARGET_JOBS_PER_S,
        "lateness_p99": result["lateness_ms"]["p99"] < TARGET_P99_MS,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--interval", type=float, default=Settings().delayed_release_interval)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "delayed.json"))
    p.add_argument("--releaser", metavar="URL", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.releaser:
        releaser_main(args.releaser, args.interval)
        return 0
    result = run(args.jobs, args.interval)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    t, lat = result["throughput_jobs_per_s"], result["lateness_ms"]
    print(
        f"delayed store, {args.jobs:,} jobs of {result['payload_bytes']} B:\n"
        f"  release throughput: {t['one_releaser']:,} jobs/s (1 releaser), "
        f"{t['two_releasers']:,} jobs/s (2 racing)   target >= {TARGET_JOBS_PER_S:,.0f}\n"
        f"  lateness, all due at once, 2 releasers every {args.interval:g} s: "
        f"p50 {lat['p50']} ms, p99 {lat['p99']} ms, max {lat['max']} ms   "
        f"target p99 < {TARGET_P99_MS:.0f}\n"
        f"  Redis memory: {result['redis_bytes_per_job']} bytes per stored job\n"
        f"  written to {out}"
    )
    return 0 if all(result["met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
