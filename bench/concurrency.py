"""What a per-key concurrency limit costs and does: ``python -m bench.concurrency``
(``make bench``).

One private ``redis-server``; for each variant of ``bench/apps/concurrency.py`` (bare
Celery, ``ReliableTask`` without a key, with a key over 16 accounts at limit 1, with one
key at limit 1), two real ``celery worker`` processes (prefork -c 2, the flags of
``bench/throughput.py``'s baselines) and N jobs of 20 ms sent at once. Printed per
variant: starts per second, as a ratio against bare Celery, the most jobs of one key that
ever started within one body time of each other, and the deliveries that had to wait per
job (``jobs_concurrency_waited_total`` over N: each is a publish and a fetch).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from typing import Any

import redis

from bench.apps.concurrency import BODY_S, STARTS, VARIANTS, make_app
from bench.throughput import ROOT, _Worker, baseline_argv, source_state
from jobs_platform.testing import RedisServer, wait_for

MODULE = "bench.apps.concurrency"


def waited(app: Any, task: str) -> float:
    from jobs_platform.exporter.server import exposition

    for line in exposition(app).splitlines():
        if line.startswith(f'jobs_concurrency_waited_total{{task="{task}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def run(variant: str, server: RedisServer, db: int, n: int, log_dir: str) -> dict[str, Any]:
    url = f"redis://127.0.0.1:{server.port}/{db}"
    marks = redis.Redis(port=server.port, db=db + 1)
    app, task, queue = make_app(url, variant)
    env = {
        "BENCH_CONC_VARIANT": variant,
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
            hostname = f"{variant}{i}-{token}@conc"
            argv = baseline_argv(MODULE, queue, "info")(hostname)  # "ready." is at info
            worker = _Worker(argv, env=env, hostname=hostname, cwd=str(ROOT), log_dir=log_dir)
            worker.start()
            workers.append(worker)
        keyed = variant.startswith("keyed")
        if variant == "celery":
            with app.producer_or_acquire() as producer:
                for i in range(n):
                    task.apply_async((i,), producer=producer)
        else:
            task.delay_many([(i,) for i in range(n)])
        wait_for(
            lambda: marks.llen(STARTS) >= n,
            timeout_s=120 + n * BODY_S * 4,
            message=f"{variant}: {n} starts",
        )
        starts = [float(x) for x in marks.lrange(STARTS, 0, -1)]
        row: dict[str, Any] = {
            "jobs": n,
            "starts_per_s": round(n / (max(starts) - min(starts)), 1),
        }
        if keyed:
            # The workers flush their counts every JOBS_METRICS_FLUSH_INTERVAL (2 s).
            time.sleep(3)
            row["waits_per_job"] = round(waited(app, task.name) / n, 2)
        return row
    finally:
        for worker in workers:
            worker.stop()
        app.close()
        marks.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    options = parser.parse_args()
    server = RedisServer().start()
    rows: dict[str, dict[str, Any]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-conc-") as log_dir:
            for i, variant in enumerate(VARIANTS):
                rows[variant] = run(variant, server, 2 * i, options.jobs, log_dir)
    finally:
        server.stop()
    print(f"\nPer-key concurrency, {options.jobs} jobs of {BODY_S * 1000:g} ms, two workers -c 2")
    state = source_state()
    print(
        f"(commit {state.get('commit')}, uncommitted changes: {state.get('uncommitted_changes')})\n"
    )
    print("| variant | starts/s | / bare Celery | waits per job |")
    print("|---|---|---|---|")
    labels = {
        "celery": "bare Celery",
        "reliable": "ReliableTask, no key",
        "keyed16": "ReliableTask, 16 keys, limit 1",
        "keyed1": "ReliableTask, 1 key, limit 1",
    }
    base = rows["celery"]["starts_per_s"]
    for variant, row in rows.items():
        print(
            f"| {labels[variant]} | {row['starts_per_s']} | {row['starts_per_s'] / base:.2f} "
            f"| {row.get('waits_per_job', '-')} |"
        )
    serial = 1 / BODY_S
    print(
        f"\none key at limit 1 runs one job at a time: at most {serial:g} starts/s for "
        f"{BODY_S * 1000:g} ms jobs; measured {rows['keyed1']['starts_per_s']}"
    )


if __name__ == "__main__":
    main()
