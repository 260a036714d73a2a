"""The cost table: worker CPU per task of each pinned setting, toggled alone on Celery's defaults.

``python -m bench.costs`` (``make bench``). One private ``redis-server``; every variant is a
real ``celery worker`` (prefork -c 2, the flags of ``bench/throughput.py``'s baselines) of an
app from ``bench/apps/costs.py``: bare Celery with its defaults, the same with one of the
platform's pinned settings switched on, and the full platform (``ReliableTask`` on
``create_app``). All workers are started once and kept.

Worker CPU per task is what the kernel charged the worker's process group (main process and
pool children, user + system, from ``/proc/<pid>/stat``) while it ran a round, divided by the
round's tasks: the main process's share (consuming, acknowledging, events) counts as much as
the task's own. Each round's N messages are published into a staging database while no
worker is busy, then moved into the variant's queue with one atomic ``MOVE``; the round ends
when the last tasks have run and nothing is left queued or unacknowledged. Variants run
back to back, the order reversed every other round; CPU per task is the median over the
rounds, Δ and ratio the medians of the per-round differences with the compared row (Celery's
defaults; for ``task_track_started`` and ``result_extended``, results stored), so load that
hits a whole round cancels.
Background timers (a bootstep's interval work) are charged to the tasks of the round they
fall in, as a worker would pay them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from bench.apps.costs import ON_RESULTS, PLATFORM, VARIANTS, make_app
from bench.throughput import ROOT, _Worker, baseline_argv, group_cpu_s, source_state
from jobs_platform.testing import RedisServer, wait_for

KINDS = ("noop", "sleep2ms")
MARKS_DB = 0
STAGING_DB = 15
MODULE = "bench.apps.costs"


@dataclasses.dataclass
class Variant:
    key: str
    label: str
    db: int
    app: Any = None
    tasks: dict[str, Any] = dataclasses.field(default_factory=dict)
    queue: str = "celery"
    worker: _Worker | None = None


def make_variants() -> list[Variant]:
    variants = [
        Variant(key, label, i) for i, (key, (label, _, _)) in enumerate(VARIANTS.items(), 1)
    ]
    variants.append(
        Variant(PLATFORM, "full platform: ReliableTask on create_app", len(variants) + 1)
    )
    if len(variants) >= STAGING_DB:
        raise SystemExit(f"too many variants for one redis-server: {len(variants)}")
    return variants


class Costs:
    def __init__(self, server: RedisServer, variants: list[Variant], log_dir: str) -> None:
        self.port = server.port
        self.base = f"redis://127.0.0.1:{server.port}"
        self.variants = variants
        self.log_dir = log_dir
        self.marks = redis.Redis(port=server.port, db=MARKS_DB)
        self.token = uuid.uuid4().hex[:6]

    def url(self, db: int) -> str:
        return f"{self.base}/{db}"

    def start(self, loglevel: str) -> None:
        for v in self.variants:
            v.app, v.tasks, v.queue = make_app(self.url(STAGING_DB), v.key)
            hostname = f"{v.key}-{self.token}@cost"
            argv = baseline_argv(MODULE, v.queue, loglevel)(hostname)
            env = {
                "BENCH_COST_VARIANT": v.key,
                "BENCH_BROKER_URL": self.url(v.db),
                "BENCH_MARKS_URL": self.url(MARKS_DB),
                "JOBS_BROKER_URL": self.url(v.db),
                "JOBS_DATABASE_URL": f"sqlite:///{self.log_dir}/jobs-{v.db}.sqlite3",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
            }
            v.worker = _Worker(
                argv, env=env, hostname=hostname, cwd=str(ROOT), log_dir=self.log_dir
            )
            v.worker.start(wait=False)  # readiness = the warm-up round completing

    def stop(self) -> None:
        for v in self.variants:
            if v.worker is not None:
                v.worker.stop()
            if v.app is not None:
                v.app.close()

    def measure(self, v: Variant, kind: str, n: int, tag: str, marks: int) -> tuple[float, float]:
        """(worker CPU µs per task, tasks/s) for ``n`` pre-queued tasks."""
        k = max(1, min(marks, n // 4))
        prefix = f"cost:{tag}:{v.key}:{kind}"
        staging = redis.Redis(port=self.port, db=STAGING_DB)
        target = redis.Redis(port=self.port, db=v.db)
        assert v.worker is not None and v.worker.process is not None
        try:
            task = v.tasks[kind]
            with v.app.producer_or_acquire() as producer:
                for i in range(n):
                    mark = f"{prefix}:start" if i < k else f"{prefix}:end" if i >= n - k else None
                    task.apply_async((mark,), producer=producer)
            if staging.llen(v.queue) != n:
                raise RuntimeError(f"{v.key}: staged {staging.llen(v.queue)} of {n} messages")
            cpu0 = group_cpu_s(v.worker.process.pid)
            if not staging.move(v.queue, v.db):
                raise RuntimeError(f"{v.key}: queue {v.queue!r} not empty before the round")

            def done() -> bool:
                if not v.worker or not v.worker.alive:
                    raise RuntimeError(f"worker {v.key} exited:\n{v.worker and v.worker.log()}")
                return bool(self.marks.llen(f"{prefix}:end") >= k)

            wait_for(done, timeout_s=120 + n / 20, interval_s=0.005, message=f"{v.key}/{kind}")
            wait_for(
                lambda: target.llen(v.queue) == 0 and target.hlen("unacked") == 0,
                timeout_s=30,
                interval_s=0.005,
                message=f"{v.key}/{kind} to drain",
            )
            cpu1 = group_cpu_s(v.worker.process.pid)
            starts = [float(x) for x in self.marks.lrange(f"{prefix}:start", 0, -1)]
            ends = [float(x) for x in self.marks.lrange(f"{prefix}:end", 0, -1)]
            self.marks.delete(f"{prefix}:start", f"{prefix}:end")
            return (cpu1 - cpu0) * 1e6 / n, n / (max(ends) - min(starts))
        finally:
            staging.close()
            target.close()


def summarise(samples: dict[str, dict[str, list[float]]], rates: dict[str, Any]) -> dict[str, Any]:
    """Per variant and kind: median CPU per task, and Δ and ratio against the compared row as
    medians of the per-round differences (a round's background load hits both alike)."""
    rows = {}
    for key, per in samples.items():
        base = "results" if key in ON_RESULTS else "defaults"
        row: dict[str, Any] = {"compared_with": base}
        for kind in KINDS:
            pairs = list(zip(per[kind], samples[base][kind], strict=True))
            mine = per[kind]
            row[kind] = {
                "cpu_us_per_task": round(statistics.median(mine), 1),
                "min_us": round(min(mine), 1),
                "delta_us": round(statistics.median(a - b for a, b in pairs), 1),
                "ratio": round(statistics.median(a / b for a, b in pairs), 2),
                "tasks_per_s": round(statistics.median(rates[key][kind]), 1),
            }
        rows[key] = row
    return rows


def print_report(result: dict[str, Any]) -> None:
    rows, labels = result["summary"], result["labels"]
    cfg = result["config"]
    print(
        f"\nWorker CPU per task (µs; median of {cfg['rounds']} rounds of {cfg['tasks']} tasks; "
        "prefork -c 2): each setting alone on Celery's defaults"
    )
    cols = f"{'µs':>9} {'Δ':>7} {'ratio':>6}"
    print(f"{'setting':<62} {'no-op':^24}   {'2-ms task':^24}")
    print(f"{'':<62} {cols}   {cols}")
    for key, row in rows.items():
        label = labels[key] + (" (vs results)" if row["compared_with"] == "results" else "")
        cells = []
        for kind in KINDS:
            c = row[kind]
            cells.append(f"{c['cpu_us_per_task']:9.0f} {c['delta_us']:+7.0f} {c['ratio']:6.2f}")
        print(f"{label[:62]:<62} {cells[0]}   {cells[1]}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    variants = make_variants()
    cpu: dict[str, dict[str, list[float]]] = {v.key: {k: [] for k in KINDS} for v in variants}
    rates: dict[str, dict[str, list[float]]] = {v.key: {k: [] for k in KINDS} for v in variants}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobs-costs-") as log_dir, RedisServer() as server:
        costs = Costs(server, variants, log_dir)
        try:
            costs.start(args.loglevel)
            for v in variants:  # warm-up, and the readiness check
                for kind in KINDS:
                    costs.measure(v, kind, max(40, args.tasks // 5), "warm", args.marks)
            for r in range(args.rounds):
                for kind in KINDS:
                    for v in variants if r % 2 == 0 else variants[::-1]:
                        us, rate = costs.measure(v, kind, args.tasks, f"r{r}", args.marks)
                        cpu[v.key][kind].append(us)
                        rates[v.key][kind].append(rate)
                        print(
                            f"round {r + 1}/{args.rounds} {kind:<8} {v.key:<15} "
                            f"{us:7.0f} µs CPU/task {rate:7.1f} tasks/s",
                            flush=True,
                        )
        finally:
            costs.stop()
    return {
        "benchmark": "jobs-platform cost table",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {
            "tasks": args.tasks,
            "rounds": args.rounds,
            "loglevel": args.loglevel,
            "pool": "prefork -c 2, --without-gossip --without-mingle --without-heartbeat",
            "method": "worker process group CPU (user+system, /proc) per task over a "
            "pre-filled queue (staged, then MOVEd); median over rounds; order reversed "
            "every other round",
        },
        "source": source_state(),
        "machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "labels": {v.key: v.label for v in variants},
        "argv": {
            v.key: baseline_argv(MODULE, v.queue, args.loglevel)(f"{v.key}@cost")[2:]
            for v in variants
        },
        "samples": {
            "cpu_us_per_task": {
                k: {kk: [round(x, 1) for x in xs] for kk, xs in m.items()} for k, m in cpu.items()
            },
            "tasks_per_s": {
                k: {kk: [round(x, 1) for x in xs] for kk, xs in m.items()} for k, m in rates.items()
            },
        },
        "summary": summarise(cpu, rates),
        "duration_s": round(time.monotonic() - started, 1),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.costs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tasks", type=int, default=600, help="tasks per variant, kind and round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--marks", type=int, default=20, help="tasks that record at each end")
    p.add_argument("--loglevel", default="WARNING")
    p.add_argument("--quick", action="store_true", help="400 tasks, 1 round")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "costs.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds = 400, 1
    if args.tasks < 4 * args.marks or args.rounds < 1:
        p.error("--tasks must be >= 4 x --marks and --rounds >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    print_report(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out} ({result['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
