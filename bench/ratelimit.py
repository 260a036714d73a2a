"""What a shared rate limit does under a burst: ``python -m bench.ratelimit`` (``make bench``).

One private ``redis-server``; for each variant of ``bench/apps/ratelimit.py`` (bare Celery's
``rate_limit="5/s"``, and ``ReliableTask``'s), two real ``celery worker`` processes (prefork
-c 2, the flags of ``bench/throughput.py``'s baselines) and a burst of N jobs sent at once.
Printed per variant: the most starts in any one-second window (what the partner sees
against its 5/s), the overall rate, the wall time, and for the platform the deferrals per
job (``jobs_rate_deferred_total`` over N: each deferral is a publish, a fetch and a pool
slot). Targets (issue 18): at most 1.5 deferrals per job, at most 5 (+1) starts per window.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from typing import Any

import redis

from bench.apps.ratelimit import STARTS, VARIANTS, make_app
from bench.throughput import ROOT, _Worker, baseline_argv, source_state
from jobs_platform.testing import RedisServer, wait_for

MODULE = "bench.apps.ratelimit"
LIMIT_PER_S = 5
MAX_DEFERRALS_PER_JOB = 1.5


def max_in_window(starts: list[float], window_s: float) -> int:
    starts = sorted(starts)
    most, first = 0, 0
    for last, t in enumerate(starts):
        while t - starts[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most


def deferred(app: Any, key: str) -> float:
    from jobs_platform.exporter.server import exposition

    for line in exposition(app).splitlines():
        if line.startswith(f'jobs_rate_deferred_total{{key="{key}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def run(variant: str, server: RedisServer, db: int, n: int, log_dir: str) -> dict[str, Any]:
    url = f"redis://127.0.0.1:{server.port}/{db}"
    marks = redis.Redis(port=server.port, db=db + 1)
    app, task, queue = make_app(url, variant)
    env = {
        "BENCH_RATE_VARIANT": variant,
        "BENCH_BROKER_URL": url,
        "BENCH_MARKS_URL": f"redis://127.0.0.1:{server.port}/{db + 1}",
        "JOBS_BROKER_URL": url,
        "JOBS_DATABASE_URL": f"sqlite:///{log_dir}/jobs-{db}.sqlite3",
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }
    workers = []
    token = uuid.uuid4().hex[:6]
    try:
        for i in range(2):
            hostname = f"{variant}{i}-{token}@rate"
            argv = baseline_argv(MODULE, queue, "info")(hostname)  # "ready." is at info
            worker = _Worker(argv, env=env, hostname=hostname, cwd=str(ROOT), log_dir=log_dir)
            worker.start()
            workers.append(worker)
        before = deferred(app, task.name) if variant == "reliable" else 0.0
        t0 = time.time()
        if variant == "reliable":
            task.delay_many([(i,) for i in range(n)])
        else:
            with app.producer_or_acquire() as producer:
                for i in range(n):
                    task.apply_async((i,), producer=producer)
        wait_for(
            lambda: marks.llen(STARTS) >= n,
            timeout_s=60 + n / LIMIT_PER_S * 2,
            message=f"{variant}: {n} starts",
        )
        starts = [float(x) for x in marks.lrange(STARTS, 0, -1)]
        row: dict[str, Any] = {
            "jobs": n,
            "wall_s": round(max(starts) - t0, 1),
            "starts_per_s": round(n / (max(starts) - min(starts)), 2),
            "max_starts_in_1s": max_in_window(starts, 1.0),
        }
        if variant == "reliable":
            # The workers flush their counts every JOBS_METRICS_FLUSH_INTERVAL (2 s).
            total = wait_for(
                lambda: (d := deferred(app, task.name) - before) >= n - LIMIT_PER_S and d,
                timeout_s=15,
                message="the deferrals counted",
            )
            row["deferrals"] = int(total)
            row["deferrals_per_job"] = round(total / n, 2)
        return row
    finally:
        for worker in workers:
            worker.stop()
        app.close()
        marks.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    options = parser.parse_args()
    server = RedisServer().start()
    rows: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-rate-") as log_dir:
            for i, variant in enumerate(VARIANTS):
                rows[variant] = run(variant, server, 2 * i, options.jobs, log_dir)
    finally:
        server.stop()
    print(f"\nRate limit {LIMIT_PER_S}/s, {options.jobs} jobs sent at once, two workers")
    state = source_state()
    print(
        f"(commit {state.get('commit')}, uncommitted changes: {state.get('uncommitted_changes')})\n"
    )
    print("| variant | max starts in a 1-s window | starts/s | wall s | deferrals per job |")
    print("|---|---|---|---|---|")
    labels = {"celery": "bare Celery rate_limit", "reliable": "ReliableTask rate_limit"}
    for variant, row in rows.items():
        per_job = row.get("deferrals_per_job", "(held in the worker)")
        print(
            f"| {labels[variant]} | {row['max_starts_in_1s']} | {row['starts_per_s']} "
            f"| {row['wall_s']} | {per_job} |"
        )
    mine = rows["reliable"]
    ratio = mine["max_starts_in_1s"] / rows["celery"]["max_starts_in_1s"]
    print(f"\npeak starts per second, ReliableTask / bare Celery: {ratio:.2f}")
    window_ok = mine["max_starts_in_1s"] <= LIMIT_PER_S + 1
    churn_ok = mine["deferrals_per_job"] <= MAX_DEFERRALS_PER_JOB
    print(
        f"targets: at most {LIMIT_PER_S} (+1) starts in any 1-s window: "
        f"{'met' if window_ok else 'MISSED'}; at most {MAX_DEFERRALS_PER_JOB} deferrals per "
        f"job: {'met' if churn_ok else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
