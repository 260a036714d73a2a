"""Throughput of bare Celery vs jobs-platform, and idle memory of the per-queue workers.

``python -m bench.throughput`` (``make bench``). One private ``redis-server`` on loopback; every
variant is a real ``celery worker`` subprocess with its own Redis database, started once and
kept for the whole run:

1. ``default``  bare Celery, its defaults (acks early, prefetch 4, no result backend), prefork -c 2
2. ``hardened`` bare Celery, plain ``@app.task``, ``jobs_platform.app.celery_config``, prefork -c 2
3. ``reliable`` ``ReliableTask`` on ``create_app``, prefork -c 2
4. ``fast``     ``ReliableTask`` on the ``fast`` profile, exactly as ``worker_argv`` builds it, with
               the monitoring a user gets by default: the metrics and health bootsteps
               ``create_app`` installs and ``JOBS_TASK_EVENTS=auto`` (no monitor runs here, so
               no task events: the cost of monitoring while nobody watches)
5. ``fast-events`` (information only) 4 with ``JOBS_TASK_EVENTS=on``: what the same worker costs
               while a monitor (Flower) listens and task events flow

How it is measured: for each (variant, task kind) the round's N messages are published through
an identical app into a *staging* database while no worker is busy, then moved into the
variant's queue with one atomic ``MOVE``, so the worker starts on a full queue and the producer
never competes for the CPU. The first K tasks record ``time.time()`` when their body starts,
the last K when it ends (the other N - 2K tasks record nothing); throughput is
N / (last end - first start). All tasks use ``ignore_result=True`` (no result storage in any
variant). After a warm-up round, every round runs all variants back to back (compared pairs
adjacent, order reversed every other round); a ratio is the median of the per-round ratios.

Enqueue -> start latency: no-op tasks sent one at a time to idle workers, the variants
interleaved sample by sample so background load hits them alike; p50 and p90 per variant.
Every ratio and the latency are printed with their target and met/missed (information only
where there is none) and written to ``bench/results/throughput.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import celery
import kombu
import redis

from jobs_platform.profiles import PROFILES, worker_argv
from jobs_platform.testing import RedisServer, WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("noop", "sleep2ms")
MARKS_DB = 0
MEMORY_DB = 7
STAGING_OFFSET = 8  # variant i consumes DB i and is staged in DB i + 8
#: ratio key -> minimum (median of per-round ratios); issue 11's targets.
TARGETS = {
    "reliable/hardened:noop": 0.95,
    "reliable/hardened:sleep2ms": 0.95,
    "fast/default:noop": 0.85,
    "fast/default:sleep2ms": 0.95,
}
#: Latency target: the fast profile's p50 no worse than bare Celery's defaults.
LATENCY_PAIR = ("fast", "default")


@dataclasses.dataclass
class Variant:
    key: str
    label: str
    module: str
    queue: str
    db: int
    argv: Callable[[str], list[str]]  # hostname -> argv
    worker: WorkerProcess | None = None
    app: Any = None
    tasks: dict[str, Any] = dataclasses.field(default_factory=dict)


class _Worker(WorkerProcess):
    """A WorkerProcess that runs a given argv (the profile's, or the baseline's)."""

    def __init__(self, argv: list[str], **kwargs: Any) -> None:
        super().__init__(argv[argv.index("-A") + 1], [], **kwargs)
        self._argv = argv

    def argv(self) -> list[str]:
        return self._argv


def _celery(argv: list[str]) -> list[str]:
    """``celery ...`` -> this interpreter's celery, so the venv is used even without activation."""
    assert argv[0] == "celery"
    return [sys.executable, "-m", "celery", *argv[1:]]


def baseline_argv(module: str, queue: str, loglevel: str) -> Callable[[str], list[str]]:
    """Variants 1-3: prefork -c 2 (Celery's default pool on 2 cores), prefetch from the app's
    config, and the same start-up flags the profiles use (they do not change delivery)."""

    def build(hostname: str) -> list[str]:
        return _celery(
            [
                "celery",
                "-A",
                module,
                "worker",
                "-Q",
                queue,
                "-P",
                "prefork",
                "-c",
                "2",
                "-n",
                hostname,
                "-l",
                loglevel,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )

    return build


def profile_argv(
    module: str, queue: str, loglevel: str, override: tuple[str, int, int] | None = None
) -> Callable[[str], list[str]]:
    """The profile's own command (``worker_argv``); ``override`` swaps pool/-c/prefetch."""

    def build(hostname: str) -> list[str]:
        argv = worker_argv(module, queue, hostname=hostname, loglevel=loglevel)
        if override is not None:
            for flag, value in zip(("-P", "-c", "--prefetch-multiplier"), override, strict=True):
                argv[argv.index(flag) + 1] = str(value)
        return _celery(argv)

    return build


def make_variants(
    loglevel: str, candidates: list[tuple[str, int, int]], events_on: bool = True
) -> list[Variant]:
    fast = PROFILES["fast"]
    variants = [
        Variant(
            "default",
            "bare Celery, defaults",
            "bench.apps.default",
            "celery",
            1,
            baseline_argv("bench.apps.default", "celery", loglevel),
        ),
        Variant(
            "hardened",
            "bare Celery, hardened settings",
            "bench.apps.hardened",
            "fast",
            2,
            baseline_argv("bench.apps.hardened", "fast", loglevel),
        ),
        Variant(
            "reliable",
            "ReliableTask, prefork -c 2",
            "bench.apps.reliable",
            "fast",
            3,
            baseline_argv("bench.apps.reliable", "fast", loglevel),
        ),
        Variant(
            "fast",
            f"ReliableTask, fast profile ({fast.pool} -c {fast.concurrency}, "
            f"prefetch {fast.prefetch_multiplier})",
            "bench.apps.reliable",
            "fast",
            4,
            profile_argv("bench.apps.reliable", "fast", loglevel),
        ),
    ]
    if events_on:
        variants.append(
            Variant(
                "fast-events",
                "(info) 4 with task events on (a monitor listening)",
                "bench.apps.reliable_events",
                "fast",
                5,
                profile_argv("bench.apps.reliable_events", "fast", loglevel),
            )
        )
    for i, spec in enumerate(candidates, 1):
        pool, conc, prefetch = spec
        variants.append(
            Variant(
                f"cand{i}",
                f"candidate fast profile ({pool} -c {conc}, prefetch {prefetch})",
                "bench.apps.reliable",
                "fast",
                len(variants) + 1,
                profile_argv("bench.apps.reliable", "fast", loglevel, spec),
            )
        )
    if len(variants) >= MEMORY_DB:
        raise SystemExit(f"too many variants: at most {MEMORY_DB - 1} (4 + info + candidates)")
    return variants


# -- measurement -----------------------------------------------------------------------------


class Bench:
    def __init__(self, server: RedisServer, variants: list[Variant], log_dir: str) -> None:
        self.base = f"redis://127.0.0.1:{server.port}"
        self.port = server.port
        assert server.process is not None
        self.redis_pid = server.process.pid
        self.variants = variants
        self.log_dir = log_dir
        self.marks = redis.Redis(port=server.port, db=MARKS_DB)
        self.token = uuid.uuid4().hex[:6]

    def url(self, db: int) -> str:
        return f"{self.base}/{db}"

    def env(self, db: int) -> dict[str, str]:
        return {
            "BENCH_BROKER_URL": self.url(db),
            "BENCH_MARKS_URL": self.url(MARKS_DB),
            # The dead-letter bootstep migrates this database at start: keep it private.
            "JOBS_DATABASE_URL": f"sqlite:///{self.log_dir}/jobs-{db}.sqlite3",
            # The default, pinned so that the shell's environment cannot change what row 4
            # measures (reliable_events overrides it in code).
            "JOBS_TASK_EVENTS": "auto",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }

    def start_workers(self) -> None:
        for v in self.variants:
            module = importlib.import_module(v.module)
            v.app, v.tasks = module.make_app(self.url(v.db + STAGING_OFFSET))
            hostname = f"{v.key}-{self.token}@bench"
            v.worker = _Worker(
                v.argv(hostname),
                env=self.env(v.db),
                hostname=hostname,
                cwd=str(ROOT),
                log_dir=self.log_dir,
            )
            v.worker.start(wait=False)  # readiness = the warm-up round completing

    def stop_workers(self) -> None:
        for v in self.variants:
            if v.worker is not None:
                v.worker.stop()
            if v.app is not None:
                v.app.close()

    def _check_alive(self, v: Variant) -> None:
        assert v.worker is not None
        if not v.worker.alive:
            raise RuntimeError(f"worker {v.key} exited:\n{v.worker.log()[-3000:]}")

    def publish(self, v: Variant, kind: str, n: int, prefix: str, k: int) -> None:
        task = v.tasks[kind]
        with v.app.producer_or_acquire() as producer:
            for i in range(n):
                mark = f"{prefix}:start" if i < k else f"{prefix}:end" if i >= n - k else None
                task.apply_async((mark,), producer=producer)

    def measure(
        self, v: Variant, kind: str, n: int, tag: str, marks: int, timeout_s: float
    ) -> tuple[float, float, float]:
        """(tasks/s, worker CPU ms/task, redis-server CPU ms/task) for ``n`` pre-queued tasks."""
        k = max(1, min(marks, n // 4))
        prefix = f"bench:{tag}:{v.key}:{kind}"
        staging = redis.Redis(port=self.port, db=v.db + STAGING_OFFSET)
        target = redis.Redis(port=self.port, db=v.db)
        try:
            self.publish(v, kind, n, prefix, k)
            if staging.llen(v.queue) != n:
                raise RuntimeError(f"{v.key}: staged {staging.llen(v.queue)} of {n} messages")
            assert v.worker is not None and v.worker.process is not None
            cpu0 = group_cpu_s(v.worker.process.pid), group_cpu_s(self.redis_pid)
            if not staging.move(v.queue, v.db):  # atomic; wakes the worker's BRPOP
                raise RuntimeError(f"{v.key}: queue {v.queue!r} not empty before the round")
            wait_for(
                lambda: (self._check_alive(v), self.marks.llen(f"{prefix}:end") >= k)[1],
                timeout_s=timeout_s,
                interval_s=0.005,
                message=f"{v.key}/{kind} to finish {n}",
            )
            wait_for(  # nothing left queued or unacknowledged before the next variant runs
                lambda: target.llen(v.queue) == 0 and target.hlen("unacked") == 0,
                timeout_s=30,
                interval_s=0.005,
                message=f"{v.key}/{kind} to drain",
            )
            cpu1 = group_cpu_s(v.worker.process.pid), group_cpu_s(self.redis_pid)
            starts = [float(x) for x in self.marks.lrange(f"{prefix}:start", 0, -1)]
            ends = [float(x) for x in self.marks.lrange(f"{prefix}:end", 0, -1)]
            self.marks.delete(f"{prefix}:start", f"{prefix}:end")
            return (
                n / (max(ends) - min(starts)),
                (cpu1[0] - cpu0[0]) * 1000 / n,
                (cpu1[1] - cpu0[1]) * 1000 / n,
            )
        finally:
            staging.close()
            target.close()

    def latency(self, samples: int, gap_s: float) -> dict[str, dict[str, float]]:
        """Enqueue -> body start (ms) of no-op tasks sent one at a time to idle workers.

        The variants take turns sample by sample (the first one rotating), so a change in
        background load hits all of them alike."""
        sent: dict[str, list[float]] = {v.key: [] for v in self.variants}
        with contextlib.ExitStack() as stack:
            senders = []
            for v in self.variants:
                # Published straight to the worker's own database (no staging).
                app, tasks = importlib.import_module(v.module).make_app(self.url(v.db))
                stack.callback(app.close)
                senders.append((v, tasks["noop"], stack.enter_context(app.producer_or_acquire())))
            for i in range(samples):
                first = i % len(senders)
                for v, noop, producer in senders[first:] + senders[:first]:
                    sent[v.key].append(time.time())
                    noop.apply_async((f"bench:lat:{v.key}:start",), producer=producer)
                    time.sleep(gap_s)
        out = {}
        for v in self.variants:
            key = f"bench:lat:{v.key}:start"
            wait_for(
                partial(lambda k: self.marks.llen(k) >= samples, key),
                timeout_s=30,
                message=f"{v.key} latency samples",
            )
            started = sorted(float(x) for x in self.marks.lrange(key, 0, -1))
            self.marks.delete(key)
            lat = sorted((s - e) * 1000 for s, e in zip(started, sent[v.key], strict=True))
            out[v.key] = {
                "p50_ms": round(statistics.median(lat), 2),
                "p90_ms": round(lat[int(0.9 * (len(lat) - 1))], 2),
            }
        return out


# -- memory ----------------------------------------------------------------------------------


def _group_stats(pgid: int) -> Iterator[tuple[Path, list[str]]]:
    """(/proc/<pid>, stat fields after the command name) of every process in group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:
                yield entry, fields
        except (OSError, ValueError, IndexError):
            continue  # the process went away


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds used so far by the live processes of group ``pgid``."""
    return sum(int(f[11]) + int(f[12]) for _, f in _group_stats(pgid)) / CLOCK_TICKS


def group_memory(pgid: int) -> dict[str, float]:
    """RSS and PSS (MB) summed over every process of the process group ``pgid``."""
    rss = pss = 0
    procs = 0
    for entry, _ in _group_stats(pgid):
        try:
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
            procs += 1
        except (OSError, ValueError, IndexError):
            continue  # the process went away
    return {"processes": procs, "rss_mb": round(rss / 1024, 1), "pss_mb": round(pss / 1024, 1)}


def idle_memory(bench: Bench, settle_s: float) -> dict[str, dict[str, Any]]:
    """Start the three per-queue workers exactly as ``worker_argv`` builds them; measure idle."""
    workers = {}
    for queue in PROFILES:
        hostname = f"{queue}-mem-{bench.token}@bench"
        argv = _celery(worker_argv("bench.apps.reliable", queue, hostname=hostname))
        workers[queue] = _Worker(
            argv, env=bench.env(MEMORY_DB), hostname=hostname, cwd=str(ROOT), log_dir=bench.log_dir
        )
    try:
        for w in workers.values():
            w.start(wait=False)
        for w in workers.values():
            w.wait_ready(60)
        time.sleep(settle_s)
        out = {}
        for queue, w in workers.items():
            assert w.process is not None
            p = PROFILES[queue]
            out[queue] = {
                "pool": p.pool,
                "concurrency": p.concurrency,
                **group_memory(w.process.pid),
            }
        return out
    finally:
        for w in workers.values():
            w.stop()


# -- report ----------------------------------------------------------------------------------


def latency_summary(per_variant: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per-variant latencies and the verdict: the fast profile's p50 no worse than bare's."""
    fast, default = (per_variant[key]["p50_ms"] for key in LATENCY_PAIR)
    return {
        "per_variant": per_variant,
        "target": {
            "what": "fast profile enqueue->start p50 <= bare Celery defaults p50 (idle worker)",
            "fast_p50_ms": fast,
            "default_p50_ms": default,
            "met": fast <= default,
        },
    }


def summarise(samples: dict[str, Any], variants: list[Variant]) -> dict[str, Any]:
    rates = samples["tasks_per_s"]
    med = {v.key: {k: statistics.median(rates[v.key][k]) for k in KINDS} for v in variants}

    def ratio(a: str, b: str, kind: str) -> dict[str, Any]:
        # Each round measures a and b back to back, so a round's ratio shares its background
        # load; the median of those ratios is the verdict (the ratio of medians is shown too).
        paired = [x / y for x, y in zip(rates[a][kind], rates[b][kind], strict=True)]
        quartiles = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        return {
            "median_of_round_ratios": round(statistics.median(paired), 3),
            "iqr": [round(quartiles[0], 3), round(quartiles[2], 3)],
            "of_medians": round(med[a][kind] / med[b][kind], 3),
            "round_ratios": [round(x, 3) for x in paired],
        }

    ratios: dict[str, Any] = {}
    for kind in KINDS:
        ratios[f"hardened/default:{kind}"] = ratio("hardened", "default", kind)
        ratios[f"reliable/hardened:{kind}"] = ratio("reliable", "hardened", kind)
        ratios[f"fast/default:{kind}"] = ratio("fast", "default", kind)
        for v in variants[4:]:
            ratios[f"{v.key}/default:{kind}"] = ratio(v.key, "default", kind)
    for key, r in ratios.items():
        if key in TARGETS:
            r["target"] = TARGETS[key]
            r["met"] = r["median_of_round_ratios"] >= r["target"]

    def medians(name: str, digits: int) -> dict[str, dict[str, float]]:
        return {
            v.key: {k: round(statistics.median(samples[name][v.key][k]), digits) for k in KINDS}
            for v in variants
        }

    return {
        "median_tasks_per_s": medians("tasks_per_s", 1),
        "median_worker_cpu_ms_per_task": medians("worker_cpu_ms", 3),
        "median_redis_cpu_ms_per_task": medians("redis_cpu_ms", 3),
        "ratios": ratios,
    }


def verdict(r: dict[str, Any]) -> str:
    """``>= 0.95 met`` / ``>= 0.95 MISSED``, or ``(info)`` for a ratio without a target."""
    if "target" not in r:
        return f"{'(info)':<13}"
    return f">= {r['target']:.2f} {'met' if r['met'] else 'MISSED':<6}"


def print_report(result: dict[str, Any], variants: list[Variant]) -> None:
    summary = result["summary"]
    med, cpu = summary["median_tasks_per_s"], summary["median_worker_cpu_ms_per_task"]
    cfg = result["config"]
    print(
        f"\nThroughput, tasks/s: median of {cfg['rounds']} rounds of {cfg['tasks']} tasks "
        "[min-max]; worker CPU ms per task"
    )
    print(f"{'variant':<58} {'no-op':>26} {'sleep 2 ms':>26}")
    for i, v in enumerate(variants, 1):
        cells = []
        for kind in KINDS:
            xs = result["samples"]["tasks_per_s"][v.key][kind]
            cells.append(
                f"{med[v.key][kind]:5.0f} [{min(xs):4.0f}-{max(xs):4.0f}] "
                f"{cpu[v.key][kind]:4.2f} ms"
            )
        print(f"{i}. {v.label:<55} {cells[0]:>26} {cells[1]:>26}")
    print(
        f"\n{'ratio: median of per-round ratios [IQR] target':<58} {'no-op':>34} {'sleep 2 ms':>34}"
    )
    names = [
        ("hardened/default", "2 / 1 hardening cost"),
        ("reliable/hardened", "3 / 2 ReliableTask vs same settings"),
        ("fast/default", "4 / 1 fast profile vs Celery defaults"),
    ]
    names += [(f"{v.key}/default", f"{i} / 1 {v.key}") for i, v in enumerate(variants[4:], 5)]
    for key, label in names:
        cells = []
        for kind in KINDS:
            r = summary["ratios"][f"{key}:{kind}"]
            lo, hi = r["iqr"]
            cells.append(f"{r['median_of_round_ratios']:.3f} [{lo:.2f}-{hi:.2f}] {verdict(r)}")
        print(f"{label:<58} {cells[0]:>34} {cells[1]:>34}")
    if result.get("latency"):
        latency = result["latency"]
        print("\nEnqueue -> start latency, idle worker, no-op, variants interleaved (ms)")
        for i, v in enumerate(variants, 1):
            x = latency["per_variant"][v.key]
            print(f"{i}. {v.label:<55} p50 {x['p50_ms']:5.2f}  p90 {x['p90_ms']:5.2f}")
        t = latency["target"]
        print(
            f"{'4 vs 1: fast profile p50 vs bare defaults p50':<58} "
            f"{t['fast_p50_ms']:.2f} vs {t['default_p50_ms']:.2f} ms  "
            f"target: no worse  {'met' if t['met'] else 'MISSED'}"
        )
    if result.get("memory"):
        print("\nIdle memory of the per-queue workers (worker_argv, whole process group)")
        for queue, m in result["memory"].items():
            print(
                f"  {queue:<11} {m['pool']:>8} -c {m['concurrency']:<3} {m['processes']} "
                f"processes  RSS {m['rss_mb']:6.1f} MB  PSS {m['pss_mb']:6.1f} MB"
            )


# -- main ------------------------------------------------------------------------------------


def source_state() -> dict[str, Any]:
    """The commit measured, and whether the working tree had uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout
    except OSError:
        return {}
    return {"commit": head, "uncommitted_changes": bool(status.strip())}


def parse_candidate(text: str) -> tuple[str, int, int]:
    pool, conc, prefetch = text.split(":")
    if pool not in ("prefork", "threads", "solo"):
        raise argparse.ArgumentTypeError(f"unknown pool {pool!r}")
    return pool, int(conc), int(prefetch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tasks", type=int, default=200, help="tasks per variant, kind and round")
    p.add_argument("--rounds", type=int, default=20, help="measured rounds (after one warm-up)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI-size run: 100 tasks, 2 rounds, short latency and memory phases",
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "throughput.json"))
    p.add_argument(
        "--loglevel",
        default="WARNING",
        help="worker log level for every variant (INFO logs 2 lines per task)",
    )
    p.add_argument("--marks", type=int, default=20, help="tasks that record at each end")
    p.add_argument(
        "--candidate",
        type=parse_candidate,
        action="append",
        default=[],
        metavar="POOL:C:PREFETCH",
        help="extra 'fast' profile to compare (pool, concurrency, prefetch)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the idle-memory phase")
    p.add_argument(
        "--no-events-on",
        action="store_true",
        help="skip the informational variant 4 with task events on (JOBS_TASK_EVENTS=on)",
    )
    p.add_argument("--latency-samples", type=int, default=100)
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds, args.latency_samples = 100, 2, 20
    if args.tasks < 8 or args.rounds < 1:
        p.error("--tasks must be >= 8 and --rounds >= 1")
    return args


@contextlib.contextmanager
def running(bench: Bench) -> Iterator[Bench]:
    try:
        bench.start_workers()
        yield bench
    finally:
        bench.stop_workers()


def run(args: argparse.Namespace) -> dict[str, Any]:
    variants = make_variants(args.loglevel, args.candidate, not args.no_events_on)
    names = ("tasks_per_s", "worker_cpu_ms", "redis_cpu_ms")
    samples: dict[str, Any] = {
        name: {v.key: {k: [] for k in KINDS} for v in variants} for name in names
    }
    result: dict[str, Any] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobs-bench-") as log_dir, RedisServer() as server:
        bench = Bench(server, variants, log_dir)
        with running(bench):
            timeout = 60 + args.tasks / 50
            # Warm-up (also the readiness check: a worker is up once it has run tasks).
            for v in variants:
                for kind in KINDS:
                    bench.measure(v, kind, max(40, args.tasks // 5), "warm", args.marks, 120)
            for r in range(args.rounds):
                # Compared variants run back to back (1 next to 4, 2 next to 3) and the order
                # is reversed every other round (ABBA), so drift in background load cancels.
                order = [variants[0], variants[3], *variants[4:], variants[1], variants[2]]
                for kind in KINDS:
                    for v in order if r % 2 == 0 else order[::-1]:
                        values = bench.measure(v, kind, args.tasks, f"r{r}", args.marks, timeout)
                        for name, value in zip(names, values, strict=True):
                            samples[name][v.key][kind].append(value)
                        print(
                            f"round {r + 1}/{args.rounds} {kind:<8} {v.key:<9} "
                            f"{values[0]:7.1f} tasks/s  {values[1]:5.2f} ms CPU/task",
                            flush=True,
                        )
            if args.latency_samples:
                result["latency"] = latency_summary(bench.latency(args.latency_samples, 0.01))
        if not args.no_memory:
            result["memory"] = idle_memory(bench, settle_s=1.0 if args.quick else 3.0)
    result = {
        "benchmark": "jobs-platform throughput",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {
            "tasks": args.tasks,
            "rounds": args.rounds,
            "loglevel": args.loglevel,
            "quick": args.quick,
            "marks": args.marks,
            "method": "pre-filled queue (staged, then MOVEd); N / (last end - first "
            "start) from timestamps taken by the first/last tasks; "
            "ignore_result=True everywhere; all variants in every round, compared pairs "
            "adjacent, order reversed every other round (ABBA); ratio = median of the "
            "per-round ratios; tasks/s = median over rounds",
        },
        "source": source_state(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "celery": celery.__version__,
            "kombu": kombu.__version__,
            "loadavg_end": os.getloadavg(),
        },
        "variants": {
            v.key: {"label": v.label, "argv": v.argv(f"{v.key}@bench")[2:]} for v in variants
        },
        "samples": {
            name: {
                k: {kk: [round(x, 3) for x in xs] for kk, xs in m.items()} for k, m in per.items()
            }
            for name, per in samples.items()
        },
        "summary": summarise(samples, variants),
        **result,
        "duration_s": round(time.monotonic() - started, 1),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    variants = make_variants(args.loglevel, args.candidate, not args.no_events_on)
    print_report(result, variants)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out} ({result['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
