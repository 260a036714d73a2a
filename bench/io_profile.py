"""The I/O profile: ``thirdparty`` (gevent) vs a prefork -c 2 worker on a 50-ms I/O task.

``python -m bench.io_profile`` (``make bench``). One private ``redis-server``; every variant is
a real ``celery worker`` of the same app (``bench/apps/io.py``: ``ReliableTask`` on
``create_app``) on the ``thirdparty`` queue, started by ``worker_argv`` with only pool/-c
swapped:

1. ``prefork2``   prefork -c 2 (Celery's default pool on 2 cores): the baseline
2. ``thirdparty`` the ``thirdparty`` profile as ``worker_argv`` builds it (gevent)
3. ``prefork8``   (information) the profile before it moved to gevent: prefork -c 8

The task sleeps 50 ms with ``time.sleep`` (under gevent's monkey-patching that yields, as a
socket read to a partner would). Queue pre-filled and moved in atomically, first/last tasks
timestamped, rounds interleaved with the order reversed every other round, ratio = median of
the per-round ratios: the method of ``bench/throughput.py``, whose helpers this reuses.
Idle memory is RSS and PSS over each worker's process tree, on fresh workers started as
``worker-profile`` starts them, ``--settle`` s after "ready" (``bench/memory.py``), and
again on the measured workers after the rounds. That the hard limit still holds under
gevent is proven by ``tests/acceptance/test_io_profile.py``, not here.
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
from pathlib import Path
from typing import Any

from bench.apps.io import SLEEP_S
from bench.memory import Spec, measure_idle, profile_spec, tree_memory
from bench.throughput import ROOT, Bench, Variant, profile_argv, running, source_state
from jobs_platform.profiles import PROFILES
from jobs_platform.testing import RedisServer

KIND = "io50ms"
MODULE = "bench.apps.io"
RATIO_TARGET = 10.0
RSS_TARGET_MB = 150.0
IDLE_DB = 5  # the memory phase's database (variants use 1-3, staged in 9-11)


def make_variants(loglevel: str, with_prefork8: bool) -> list[Variant]:
    profile = PROFILES["thirdparty"]
    variants = [
        Variant(
            "prefork2",
            "prefork -c 2",
            MODULE,
            "thirdparty",
            1,
            profile_argv(MODULE, "thirdparty", loglevel, ("prefork", 2, 1)),
        ),
        Variant(
            "thirdparty",
            f"thirdparty profile ({profile.pool} -c {profile.concurrency})",
            MODULE,
            "thirdparty",
            2,
            profile_argv(MODULE, "thirdparty", loglevel),
        ),
    ]
    if with_prefork8:
        variants.append(
            Variant(
                "prefork8",
                "(info) prefork -c 8, the profile before gevent",
                MODULE,
                "thirdparty",
                3,
                profile_argv(MODULE, "thirdparty", loglevel, ("prefork", 8, 1)),
            )
        )
    return variants


def tasks_for(v: Variant, base: int) -> int:
    """Round size: enough for about the same wall time per variant (~``base`` / 40 s)."""
    return base * 10 if v.key == "thirdparty" else base * 4 if v.key == "prefork8" else base


def idle_specs(with_prefork8: bool) -> list[Spec]:
    """The I/O variants as fresh idle workers of this benchmark's app (the memory phase)."""
    gevent = profile_spec("thirdparty")
    specs = [
        Spec("prefork2", "prefork -c 2", _pool(profile_spec("thirdparty", 2).argv), False),
        dataclasses.replace(gevent, label=gevent.label.replace("thirdparty", "thirdparty profile")),
    ]
    if with_prefork8:
        spec = profile_spec("thirdparty", 8)
        specs.append(Spec("prefork8", "prefork -c 8", _pool(spec.argv), False))
    return [dataclasses.replace(s, argv=_app(s.argv)) for s in specs]


def _pool(argv: list[str]) -> list[str]:
    argv = list(argv)
    argv[argv.index("-P") + 1] = "prefork"
    return argv


def _app(argv: list[str]) -> list[str]:
    argv = list(argv)
    argv[argv.index("-A") + 1] = MODULE
    return argv


def memory(bench: Bench) -> dict[str, dict[str, Any]]:
    out = {}
    for v in bench.variants:
        assert v.worker is not None and v.worker.process is not None
        out[v.key] = tree_memory(v.worker.process.pid)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    variants = make_variants(args.loglevel, not args.no_prefork8)
    rates: dict[str, list[float]] = {v.key: [] for v in variants}
    cpu: dict[str, list[float]] = {v.key: [] for v in variants}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobs-io-") as log_dir, RedisServer() as server:
        bench = Bench(server, variants, log_dir)
        # Idle memory first, on fresh workers started as worker-profile starts them.
        idle = measure_idle(
            idle_specs(not args.no_prefork8),
            broker_url=bench.url(IDLE_DB),
            log_dir=log_dir,
            settle_s=args.settle,
        )
        with running(bench):
            for v in variants:  # warm-up (also the readiness check, as in bench.throughput)
                bench.measure(v, KIND, max(20, tasks_for(v, args.tasks) // 5), "warm", 10, 120)
            for r in range(args.rounds):
                order = variants if r % 2 == 0 else variants[::-1]
                for v in order:
                    n = tasks_for(v, args.tasks)
                    rate, cpu_ms, _ = bench.measure(v, KIND, n, f"r{r}", args.marks, 60 + n / 10)
                    rates[v.key].append(rate)
                    cpu[v.key].append(cpu_ms)
                    print(
                        f"round {r + 1}/{args.rounds} {v.key:<11} {n:5d} tasks "
                        f"{rate:7.1f} tasks/s  {cpu_ms:5.2f} ms CPU/task",
                        flush=True,
                    )
            time.sleep(args.settle)
            after = memory(bench)
    paired = [a / b for a, b in zip(rates["thirdparty"], rates["prefork2"], strict=True)]
    ratio = statistics.median(paired)
    rss = idle["thirdparty"]["rss_mb"]
    return {
        "benchmark": "jobs-platform I/O profile",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {
            "task": f"ReliableTask, time.sleep({SLEEP_S}), ignore_result=True",
            "tasks_per_round": {v.key: tasks_for(v, args.tasks) for v in variants},
            "rounds": args.rounds,
            "loglevel": args.loglevel,
        },
        "source": source_state(),
        "machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "variants": {
            v.key: {"label": v.label, "argv": v.argv(f"{v.key}@bench")[2:]} for v in variants
        },
        "samples": {
            "tasks_per_s": {k: [round(x, 1) for x in xs] for k, xs in rates.items()},
            "worker_cpu_ms": {k: [round(x, 3) for x in xs] for k, xs in cpu.items()},
        },
        "summary": {
            "median_tasks_per_s": {k: round(statistics.median(xs), 1) for k, xs in rates.items()},
            "median_worker_cpu_ms_per_task": {
                k: round(statistics.median(xs), 3) for k, xs in cpu.items()
            },
            "ratio_thirdparty_over_prefork2": {
                "median_of_round_ratios": round(ratio, 2),
                "round_ratios": [round(x, 2) for x in paired],
                "target": RATIO_TARGET,
                "pass": ratio >= RATIO_TARGET,
            },
            "idle_memory_mb": idle,
            "memory_after_rounds_mb": after,
            "thirdparty_idle_rss": {
                "rss_mb": rss,
                "target_mb": RSS_TARGET_MB,
                "pass": rss <= RSS_TARGET_MB,
            },
        },
        "duration_s": round(time.monotonic() - started, 1),
    }


def print_report(result: dict[str, Any]) -> None:
    s = result["summary"]
    print("\nI/O profile: a ReliableTask that sleeps 50 ms (yields under gevent)")
    print(f"{'variant':<48} {'tasks/s':>8} {'CPU/task':>9} {'idle RSS / PSS':>18}")
    for key, v in result["variants"].items():
        m = s["idle_memory_mb"][key]
        print(
            f"{v['label']:<48} {s['median_tasks_per_s'][key]:8.1f} "
            f"{s['median_worker_cpu_ms_per_task'][key]:6.2f} ms "
            f"{m['rss_mb']:7.1f} / {m['pss_mb']:6.1f} MB"
        )
    r, m = s["ratio_thirdparty_over_prefork2"], s["thirdparty_idle_rss"]
    after = s["memory_after_rounds_mb"]["thirdparty"]["rss_mb"]
    print(
        f"thirdparty / prefork -c 2: {r['median_of_round_ratios']:.1f}x "
        f"(target >= {r['target']:g}x: {'met' if r['pass'] else 'MISSED'}); "
        f"rounds {r['round_ratios']}"
    )
    print(
        f"thirdparty idle RSS: {m['rss_mb']:.1f} MB (target <= {m['target_mb']:g} MB: "
        f"{'met' if m['pass'] else 'MISSED'}); {after:.1f} MB after the rounds"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.io_profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--tasks", type=int, default=200, help="tasks per round for prefork -c 2 (x10 gevent)"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--marks", type=int, default=10, help="tasks that record at each end")
    p.add_argument("--settle", type=float, default=3.0, help="seconds idle before memory")
    p.add_argument("--loglevel", default="WARNING")
    p.add_argument("--no-prefork8", action="store_true", help="skip the informational variant")
    p.add_argument("--quick", action="store_true", help="100 tasks, 2 rounds")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "io_profile.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds = 100, 2
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
