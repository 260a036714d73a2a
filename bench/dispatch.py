"""How fast a producer enqueues: ``python -m bench.dispatch``.

On a private redis-server, one process enqueues N jobs (default 10,000) of a two-argument
task, three ways, side by side:

1. ``delay() loop``   ``ReliableTask.delay`` once per job (the platform's single path)
2. ``delay_many``     ``ReliableTask.delay_many`` (one connection, a pipeline per chunk)
3. ``bare delay()``   bare Celery's ``delay`` once per job (its defaults: no result backend)

Both platform variants run on ``create_app``'s settings (the same app, the same task).
Every variant must leave exactly N messages in its queue, which is emptied after each
run. After a warm-up round, every round runs the three back to back (order reversed
every other round); a ratio is the median of the per-round ratios. The target is
``delay_many`` >= 5x the ``delay()`` loop. Prints a summary and writes
``bench/results/dispatch.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celery
import kombu
import redis

from jobs_platform.testing import RedisServer

ROOT = Path(__file__).resolve().parents[1]
TARGET = 5.0
VARIANTS = ("delay_loop", "delay_many", "bare_delay_loop")
LABELS = {
    "delay_loop": "delay() loop",
    "delay_many": "delay_many",
    "bare_delay_loop": "bare Celery delay() loop",
}


def platform_task(url: str, tmp: str) -> Any:
    from jobs_platform import ReliableTask, create_app

    app = create_app("bench-dispatch", broker_url=url, database_url=f"sqlite:///{tmp}/j.sqlite3")

    @app.task(base=ReliableTask, name="bench.remind_customer", queue="fast")
    def remind_customer(customer_id: int, template: str) -> None:
        """Never runs: only its messages are counted."""

    return remind_customer


def bare_task(url: str) -> Any:
    app = celery.Celery("bench-bare", broker=url, set_as_current=False)

    @app.task(name="bench.bare_remind_customer", shared=False)
    def remind_customer(customer_id: int, template: str) -> None:
        """Never runs."""

    return remind_customer


def runners(url: str, tmp: str) -> dict[str, tuple[Callable[[int], Any], str]]:
    """Each variant: a function that enqueues n jobs, and the queue they land in."""
    task, bare = platform_task(url, tmp), bare_task(url)
    return {
        "delay_loop": (lambda n: [task.delay(i, "renewal") for i in range(n)], "fast"),
        "delay_many": (lambda n: task.delay_many((i, "renewal") for i in range(n)), "fast"),
        "bare_delay_loop": (lambda n: [bare.delay(i, "renewal") for i in range(n)], "celery"),
    }


def timed(
    client: redis.Redis, run: Callable[[int], Any], queue: str, n: int
) -> tuple[float, float]:
    """Seconds (wall, this process's CPU) to enqueue n jobs; checks they are all there,
    then empties the queue."""
    client.delete(queue)
    cpu = time.process_time()
    started = time.perf_counter()
    results = run(n)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu
    queued = client.llen(queue)
    if queued != n or len(results) != n:
        raise RuntimeError(f"{queue}: {queued} messages queued, {len(results)} results, not {n}")
    client.delete(queue)
    del results
    gc.collect()  # AsyncResults unsubscribe when collected: not inside the next timing
    return elapsed, cpu


def run(n: int, rounds: int) -> dict[str, Any]:
    samples: list[dict[str, float]] = []
    cpu: list[dict[str, float]] = []
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        variants = runners(server.url, server.directory)
        for key in VARIANTS:  # warm-up: connections, pools, imports
            fun, queue = variants[key]
            timed(client, fun, queue, min(n, 500))
        for index in range(rounds):
            order = VARIANTS if index % 2 == 0 else tuple(reversed(VARIANTS))
            measured = {key: timed(client, *variants[key], n) for key in order}
            sample = {key: wall for key, (wall, _) in measured.items()}
            samples.append(sample)
            cpu.append({key: used for key, (_, used) in measured.items()})
            line = ", ".join(f"{LABELS[k]} {n / sample[k]:,.0f}/s" for k in VARIANTS)
            print(f"round {index + 1}/{rounds}: {line}", flush=True)
        client.close()
    return summarise(n, rounds, samples, cpu)


def summarise(
    n: int, rounds: int, samples: list[dict[str, float]], cpu: list[dict[str, float]]
) -> dict[str, Any]:
    def ratios(over: str) -> list[float]:
        return [s[over] / s["delay_many"] for s in samples]

    bulk_vs_loop = ratios("delay_loop")
    bulk_vs_bare = ratios("bare_delay_loop")
    loop_vs_bare = [s["bare_delay_loop"] / s["delay_loop"] for s in samples]
    jobs_per_s = {k: round(n / statistics.median(s[k] for s in samples)) for k in VARIANTS}
    ratio = round(statistics.median(bulk_vs_loop), 2)
    return {
        "benchmark": "dispatch",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {"jobs": n, "rounds": rounds, "task_args": "(int, str)"},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "celery": celery.__version__,
            "kombu": kombu.__version__,
            "loadavg_end": os.getloadavg(),
        },
        "samples_s": samples,
        "jobs_per_s": jobs_per_s,
        # The producer's own CPU per job: what stays when nothing else competes for it.
        "producer_cpu_us_per_job": {
            k: round(statistics.median(c[k] for c in cpu) / n * 1e6) for k in VARIANTS
        },
        "ratios": {
            "delay_many_over_delay_loop": ratio,
            "delay_many_over_delay_loop_min": round(min(bulk_vs_loop), 2),
            "delay_many_over_bare_delay_loop": round(statistics.median(bulk_vs_bare), 2),
            "delay_loop_over_bare_delay_loop": round(statistics.median(loop_vs_bare), 2),
        },
        "target": {"delay_many_over_delay_loop": TARGET},
        "met": ratio >= TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "dispatch.json"))
    args = p.parse_args(argv)
    result = run(args.jobs, args.rounds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    rate, ratio = result["jobs_per_s"], result["ratios"]
    verdict = "met" if result["met"] else "MISSED"
    print(
        f"dispatch, {args.jobs:,} jobs from one process (median of {args.rounds} rounds):\n"
        f"  delay() loop:             {rate['delay_loop']:>8,} jobs/s\n"
        f"  delay_many:               {rate['delay_many']:>8,} jobs/s\n"
        f"  bare Celery delay() loop: {rate['bare_delay_loop']:>8,} jobs/s\n"
        f"  delay_many / delay() loop = {ratio['delay_many_over_delay_loop']:.2f}x "
        f"(lowest round {ratio['delay_many_over_delay_loop_min']:.2f}x)   "
        f"target >= {TARGET:g}x: {verdict}\n"
        f"  delay_many / bare delay() loop = {ratio['delay_many_over_bare_delay_loop']:.2f}x; "
        f"delay() loop / bare = {ratio['delay_loop_over_bare_delay_loop']:.2f}x\n"
        f"  producer CPU per job: "
        + ", ".join(f"{LABELS[k]} {v} us" for k, v in result["producer_cpu_us_per_job"].items())
        + "\n"
        f"  written to {out}"
    )
    return 0 if result["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
