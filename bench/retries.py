"""What a retry costs: worker CPU per retry of ReliableTask vs Celery's ``autoretry_for``.

``python -m bench.retries`` (``make bench``). One private ``redis-server``; every variant is a
real ``celery worker`` (prefork -c 2, the flags of ``bench/throughput.py``'s baselines) of an
app from ``bench/apps/retries.py``, started once and kept:

1. ``celery``         bare Celery, its defaults, ``autoretry_for``, no backoff (countdown 0)
2. ``celery_pinned``  the same task on the platform's pinned configuration (acks late,
                      prefetch 1, a result backend, JOBS_TASK_EVENTS=auto): the compared row
3. ``reliable``       ``ReliableTask`` on ``create_app``, the error listed as transient, the
                      shortest backoff the policy accepts (1 ms, no jitter)
4. ``reliable_celery_retry`` (information) 3 with each retry through Celery's ``Task.retry``,
                      as ReliableTask did before its retries were made cheap

Each variant runs two kinds of round: ``ok`` (N tasks that succeed) and ``fail1`` (N tasks
that each fail their first attempt and succeed on the retry). Worker CPU per task is what the
kernel charged the worker's process group (main process and pool children, user + system,
``/proc/<pid>/stat``) over the round, divided by N: the main process's share (consuming,
acknowledging, events) counts as much as the pool child's. **CPU per retry** is
``fail1 - ok`` of the same round: everything one retry adds, the second delivery included.
Each round's N messages are staged in another database while no worker is busy, then moved
into the variant's queue with one atomic ``MOVE``; a round ends when the last tasks have
succeeded and nothing is left queued or unacknowledged. Rounds run every variant back to
back, the order reversed every other round; figures are medians over rounds, the ratio the
median of the per-round ratios (background load that hits a round hits both sides).

Two things favour Celery here. ReliableTask's policy refuses a 0-s wait, so its retries
carry a 1 ms countdown and the worker holds them on its ETA timer, which a countdown-0
retry skips (5-10 % of a ReliableTask retry on the machine measured). And the error is
raised in the task body itself, the shallowest traceback: Celery's cost grows with every
frame and chained exception (it copies and formats them), ReliableTask's does not.
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

from bench.apps.retries import VARIANTS, make_app
from bench.throughput import ROOT, _Worker, baseline_argv, group_cpu_s, source_state
from jobs_platform.testing import RedisServer, wait_for

KINDS = ("ok", "fail1")
MARKS_DB = 0
STAGING_DB = 15
MODULE = "bench.apps.retries"
COMPARED = "celery_pinned"
CANDIDATE = "reliable"
BEFORE = "reliable_celery_retry"
TARGET = 0.5
LABELS = {
    "celery": "bare Celery defaults, autoretry_for (countdown 0)",
    "celery_pinned": "Celery autoretry_for on the pinned configuration",
    "reliable": "ReliableTask on create_app (transient, 1 ms backoff)",
    "reliable_celery_retry": "(info) the same through Celery's Task.retry (before)",
}


@dataclasses.dataclass
class Variant:
    key: str
    db: int
    app: Any = None
    tasks: dict[str, Any] = dataclasses.field(default_factory=dict)
    queue: str = "celery"
    worker: _Worker | None = None


class Retries:
    def __init__(self, server: RedisServer, variants: list[Variant], log_dir: str) -> None:
        self.port = server.port
        self.base = f"redis://127.0.0.1:{server.port}"
        self.variants = variants
        self.log_dir = log_dir
        self.marks = redis.Redis(port=server.port, db=MARKS_DB)
        self.token = uuid.uuid4().hex[:6]

    def url(self, db: int) -> str:
        return f"{self.base}/{db}"

    def start(self, loglevel: str, profile_dir: str | None) -> None:
        for v in self.variants:
            v.app, v.tasks, v.queue = make_app(self.url(STAGING_DB), v.key)
            hostname = f"{v.key}-{self.token}@retry"
            argv = baseline_argv(MODULE, v.queue, loglevel)(hostname)
            env = {
                "BENCH_RETRY_VARIANT": v.key,
                "BENCH_BROKER_URL": self.url(v.db),
                "BENCH_MARKS_URL": self.url(MARKS_DB),
                "JOBS_BROKER_URL": self.url(v.db),
                "JOBS_DATABASE_URL": f"sqlite:///{self.log_dir}/jobs-{v.db}.sqlite3",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
                ),
            }
            if profile_dir:
                env["BENCH_PROFILE_DIR"] = profile_dir
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
        """(worker CPU µs per task, tasks/s) for ``n`` pre-queued tasks of ``kind``."""
        k = max(1, min(marks, n // 4))
        end = f"retry:{tag}:{v.key}:{kind}:end"
        staging = redis.Redis(port=self.port, db=STAGING_DB)
        target = redis.Redis(port=self.port, db=v.db)
        assert v.worker is not None and v.worker.process is not None
        try:
            task = v.tasks[kind]
            with v.app.producer_or_acquire() as producer:
                for i in range(n):
                    task.apply_async((end if i >= n - k else None,), producer=producer)
            if staging.llen(v.queue) != n:
                raise RuntimeError(f"{v.key}: staged {staging.llen(v.queue)} of {n} messages")
            cpu0 = group_cpu_s(v.worker.process.pid)
            t0 = time.time()
            if not staging.move(v.queue, v.db):
                raise RuntimeError(f"{v.key}: queue {v.queue!r} not empty before the round")

            def done() -> bool:
                if not v.worker or not v.worker.alive:
                    raise RuntimeError(f"worker {v.key} exited:\n{v.worker and v.worker.log()}")
                return bool(self.marks.llen(end) >= k)

            # A retry is re-published to the back of the queue, so the last tasks' successful
            # attempts come last.
            wait_for(done, timeout_s=120 + n / 10, interval_s=0.005, message=f"{v.key}/{kind}")
            wait_for(
                lambda: target.llen(v.queue) == 0 and target.hlen("unacked") == 0,
                timeout_s=30,
                interval_s=0.005,
                message=f"{v.key}/{kind} to drain",
            )
            cpu1 = group_cpu_s(v.worker.process.pid)
            ends = [float(x) for x in self.marks.lrange(end, 0, -1)]
            self.marks.delete(end)
            return (cpu1 - cpu0) * 1e6 / n, n / (max(ends) - t0)
        finally:
            staging.close()
            target.close()


def summarise(cpu: dict[str, dict[str, list[float]]], rates: dict[str, Any]) -> dict[str, Any]:
    """Per variant: median CPU per task of each kind and per retry (``fail1 - ok`` of the same
    round); the ratio to the compared row is the median of the per-round ratios."""
    per_retry = {
        key: [f - o for f, o in zip(per["fail1"], per["ok"], strict=True)]
        for key, per in cpu.items()
    }
    rows: dict[str, Any] = {}
    for key, per in cpu.items():
        row: dict[str, Any] = {
            kind: {
                "cpu_us_per_task": round(statistics.median(per[kind]), 1),
                "tasks_per_s": round(statistics.median(rates[key][kind]), 1),
            }
            for kind in KINDS
        }
        row["cpu_us_per_retry"] = round(statistics.median(per_retry[key]), 1)
        if key != COMPARED:
            pairs = list(zip(per_retry[key], per_retry[COMPARED], strict=True))
            ratios = [a / b for a, b in pairs]
            row["retry_ratio_vs_" + COMPARED] = round(statistics.median(ratios), 3)
            row["round_ratios"] = [round(x, 3) for x in ratios]
        rows[key] = row
    verdict = rows[CANDIDATE]["retry_ratio_vs_" + COMPARED]
    saved = [a / b for a, b in zip(per_retry[CANDIDATE], per_retry[BEFORE], strict=True)]
    vs_defaults = [a / b for a, b in zip(per_retry[CANDIDATE], per_retry["celery"], strict=True)]
    return {
        "rows": rows,
        "vs_celery_defaults": {
            "ratio": f"{CANDIDATE} / celery CPU per retry",
            "value": round(statistics.median(vs_defaults), 3),
        },
        "after_vs_before": {
            "ratio": f"{CANDIDATE} / {BEFORE} CPU per retry",
            "value": round(statistics.median(saved), 3),
            "round_ratios": [round(x, 3) for x in saved],
        },
        "per_retry_samples_us": {k: [round(x, 1) for x in xs] for k, xs in per_retry.items()},
        "target": {
            "ratio": f"{CANDIDATE} / {COMPARED} CPU per retry",
            "max": TARGET,
            "value": verdict,
            "met": verdict <= TARGET,
        },
    }


def print_report(result: dict[str, Any]) -> None:
    summary, cfg = result["summary"], result["config"]
    if not summary:
        return
    rows = summary["rows"]
    print(
        f"\nWorker CPU (µs; median of {cfg['rounds']} rounds of {cfg['tasks']} tasks; "
        "prefork -c 2). Per retry = fail-once task - task that succeeds, same round"
    )
    print(f"{'variant':<56} {'ok/task':>9} {'fail1/task':>11} {'per retry':>10} {'ratio':>7}")
    for key, row in rows.items():
        ratio = row.get("retry_ratio_vs_" + COMPARED)
        print(
            f"{LABELS[key]:<56} {row['ok']['cpu_us_per_task']:9.0f} "
            f"{row['fail1']['cpu_us_per_task']:11.0f} {row['cpu_us_per_retry']:10.0f} "
            f"{'' if ratio is None else f'{ratio:7.2f}'}"
        )
    t, saved = summary["target"], summary["after_vs_before"]
    print(f"\n{saved['ratio']}: {saved['value']:.2f} (what the cheap end of a retry saves)")
    bare = summary["vs_celery_defaults"]
    print(f"{bare['ratio']}: {bare['value']:.2f} (Celery with its own defaults)")
    print(
        f"{t['ratio']}: {t['value']:.2f} (target <= {t['max']}): {'met' if t['met'] else 'missed'}"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    variants = [Variant(key, i) for i, key in enumerate(VARIANTS, 1) if key in args.variants]
    kinds = tuple(k for k in KINDS if k in args.kinds)
    cpu: dict[str, dict[str, list[float]]] = {v.key: {k: [] for k in KINDS} for v in variants}
    rates: dict[str, dict[str, list[float]]] = {v.key: {k: [] for k in KINDS} for v in variants}
    complete = len(variants) == len(VARIANTS) and kinds == KINDS  # else: profiling only
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobs-retries-") as log_dir, RedisServer() as server:
        bench = Retries(server, variants, log_dir)
        try:
            bench.start(args.loglevel, args.profile_dir)
            for v in variants:  # warm-up, and the readiness check
                for kind in kinds:
                    bench.measure(v, kind, max(40, args.tasks // 5), "warm", args.marks)
            for r in range(args.rounds):
                for v in variants if r % 2 == 0 else variants[::-1]:
                    for kind in kinds if r % 2 == 0 else kinds[::-1]:
                        us, rate = bench.measure(v, kind, args.tasks, f"r{r}", args.marks)
                        cpu[v.key][kind].append(us)
                        rates[v.key][kind].append(rate)
                        print(
                            f"round {r + 1}/{args.rounds} {v.key:<14} {kind:<6} "
                            f"{us:7.0f} µs CPU/task {rate:7.1f} tasks/s",
                            flush=True,
                        )
        finally:
            bench.stop()
    return {
        "benchmark": "jobs-platform retry cost",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {
            "tasks": args.tasks,
            "rounds": args.rounds,
            "loglevel": args.loglevel,
            "pool": "prefork -c 2, --without-gossip --without-mingle --without-heartbeat",
            "method": "worker process group CPU (user+system, /proc) per task over a "
            "pre-filled queue (staged, then MOVEd); per retry = fail-once minus ok, same "
            "round; median over rounds; order reversed every other round",
        },
        "source": source_state(),
        "machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "labels": {v.key: LABELS[v.key] for v in variants},
        "samples": {
            "cpu_us_per_task": {
                k: {kk: [round(x, 1) for x in xs] for kk, xs in m.items()} for k, m in cpu.items()
            },
            "tasks_per_s": {
                k: {kk: [round(x, 1) for x in xs] for kk, xs in m.items()} for k, m in rates.items()
            },
        },
        "summary": summarise(cpu, rates) if complete else {},
        "duration_s": round(time.monotonic() - started, 1),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.retries",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tasks", type=int, default=240, help="tasks per variant, kind and round")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--marks", type=int, default=20, help="last tasks that record their end")
    p.add_argument("--loglevel", default="WARNING")
    p.add_argument("--quick", action="store_true", help="300 tasks, 1 round")
    p.add_argument(
        "--profile-dir",
        default=None,
        help="write a cProfile of every pool child of the workers here (slows them down)",
    )
    p.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=list(VARIANTS),
        help="(profiling) run only these variants; no summary unless all run",
    )
    p.add_argument(
        "--kinds",
        type=lambda s: s.split(","),
        default=list(KINDS),
        help="(profiling) run only these kinds; no summary unless both run",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "retries.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds = 300, 1
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
