"""What fairness between tenants costs: ``python -m bench.fairness`` (``make bench``).

One private ``redis-server``. Two parts:

1. **Per fetch** (no worker): the server's own time per call (``INFO commandstats``,
   ``usec_per_call``) of the fetch a worker sends, over N fetches of a full queue: kombu's
   ``BRPOP`` (bare Celery's fetch), the kill-safe fetch script on the queue's ordinary
   list without looking at a ring (as before fairness) and with fairness off (the ring
   looked at, empty), and the script taking keyed jobs from a
   ring of 1, 100, 10,000 and 100,000 keys.
2. **End to end**: for each variant of ``bench/apps/fairness.py`` (bare Celery,
   ``ReliableTask`` without a key, with ``fairness_key`` over 16 and over 1000 tenants),
   two real ``celery worker`` processes (prefork -c 2, ``bench/throughput.py``'s baseline
   flags) and N jobs of 20 ms sent at once; starts per second as a ratio against bare
   Celery.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid

import redis
from kombu.utils.json import dumps

from bench.apps.fairness import BODY_S, STARTS, VARIANTS, make_app
from bench.throughput import ROOT, _Worker, baseline_argv, source_state
from jobs_platform.brokers.redis import fair, fetch
from jobs_platform.testing import RedisServer, wait_for

MODULE = "bench.apps.fairness"
SEP = "\x06\x16"  # kombu's
RING = fair.ring_key("fast", SEP)
KEY_COUNTS = (1, 100, 10_000, 100_000)


def _message(n: int) -> str:
    """A message shaped as kombu's (what the script parses and records)."""
    return dumps(
        {
            "body": "e30=",
            "headers": {"id": f"id-{n}"},
            "properties": {
                "delivery_tag": f"tag-{n}",
                "delivery_info": {"exchange": "fast", "routing_key": "fast"},
            },
        }
    )


def _usec_per_call(client: redis.Redis, command: str) -> float:
    stats = client.info("commandstats").get(f"cmdstat_{command}") or {}
    return float(stats.get("usec_per_call", 0.0))


def _fetch(client: redis.Redis, sha: str, n: int, *, ring: bool = True) -> None:
    owner = ("jobs:worker:held:o1", "jobs:worker:owners", "jobs:worker:alive:o1")
    lists, flags = (["fast", RING], ["1", "F"]) if ring else (["fast"], ["1"])
    keys = [*lists, "unacked", "unacked_index", *owner]
    for _ in range(n):
        client.evalsha(sha, len(keys), *keys, 1000.0, "o1", 15000, *flags)


def per_fetch(server: RedisServer, n: int) -> dict[str, float]:
    client = redis.Redis(port=server.port, db=15)
    script = fetch.script_for(fetch.server_version(client.info("server")["redis_version"]))
    assert script is not None
    sha = client.script_load(script)
    rows: dict[str, float] = {}

    def fresh() -> None:
        client.flushdb()
        client.config_resetstat()

    fresh()
    client.lpush("fast", *(_message(i) for i in range(n)))
    for _ in range(n):
        client.brpop(["fast"], timeout=1)
    rows["bare Celery: kombu BRPOP"] = _usec_per_call(client, "brpop")

    fresh()
    client.lpush("fast", *(_message(i) for i in range(n)))
    _fetch(client, sha, n, ring=False)
    rows["kill-safe fetch, no ring looked at (before fairness)"] = _usec_per_call(client, "evalsha")

    fresh()
    client.lpush("fast", *(_message(i) for i in range(n)))
    _fetch(client, sha, n)
    rows["kill-safe fetch, fairness off"] = _usec_per_call(client, "evalsha")

    for keys in KEY_COUNTS:
        fresh()
        pipe = client.pipeline(transaction=False)
        for i in range(max(n, keys)):
            pipe.eval(*fair.publish_args(RING, f"tenant-{i % keys}", _message(i)))
            if i % 1000 == 999:
                pipe.execute()
        pipe.execute()
        client.config_resetstat()
        _fetch(client, sha, n)
        rows[f"kill-safe fetch, fair ring of {keys:,} keys"] = _usec_per_call(client, "evalsha")
    client.flushdb()
    client.close()
    return rows


def end_to_end(
    variant: str, server: RedisServer, db: int, n: int, log_dir: str
) -> tuple[float, float]:
    """(starts per second, seconds the dispatch of the N jobs took)."""
    url = f"redis://127.0.0.1:{server.port}/{db}"
    marks = redis.Redis(port=server.port, db=db + 1)
    app, task, queue = make_app(url, variant)
    env = {
        "BENCH_FAIR_VARIANT": variant,
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
            hostname = f"{variant}{i}-{token}@fair"
            argv = baseline_argv(MODULE, queue, "info")(hostname)  # "ready." is at info
            worker = _Worker(argv, env=env, hostname=hostname, cwd=str(ROOT), log_dir=log_dir)
            worker.start()
            workers.append(worker)
        sent_at = time.perf_counter()
        if variant == "celery":
            with app.producer_or_acquire() as producer:
                for i in range(n):
                    task.apply_async((i,), producer=producer)
        else:
            task.delay_many([(i,) for i in range(n)])
        publish_s = time.perf_counter() - sent_at
        wait_for(
            lambda: marks.llen(STARTS) >= n,
            timeout_s=120 + n * BODY_S * 4,
            message=f"{variant}: {n} starts",
        )
        starts = [float(x) for x in marks.lrange(STARTS, 0, -1)]
        return round(n / (max(starts) - min(starts)), 1), publish_s
    finally:
        for worker in workers:
            worker.stop()
        app.close()
        marks.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--fetches", type=int, default=5000)
    options = parser.parse_args()
    server = RedisServer().start()
    rates: dict[str, tuple[float, float]] = {}
    try:
        costs = per_fetch(server, options.fetches)
        with tempfile.TemporaryDirectory(prefix="bench-fair-") as log_dir:
            for i, variant in enumerate(VARIANTS):
                rates[variant] = end_to_end(variant, server, 2 * i, options.jobs, log_dir)
    finally:
        server.stop()
    state = source_state()
    print(
        f"\nFairness between tenants (commit {state.get('commit')}, uncommitted changes: "
        f"{state.get('uncommitted_changes')})"
    )
    print(f"\nPer fetch: Redis server time per call over {options.fetches} fetches\n")
    print("| fetch | µs per call (server) | / bare Celery |")
    print("|---|---|---|")
    base = costs["bare Celery: kombu BRPOP"]
    for label, usec in costs.items():
        print(f"| {label} | {usec:.2f} | {usec / base:.2f} |")
    print(f"\nEnd to end: {options.jobs} jobs of {BODY_S * 1000:g} ms, two workers -c 2\n")
    print("| variant | starts/s | / bare Celery | dispatch of all (s) |")
    print("|---|---|---|---|")
    labels = {
        "celery": "bare Celery",
        "reliable": "ReliableTask, no fairness key",
        "fair16": "ReliableTask, fairness_key over 16 tenants",
        "fair1000": "ReliableTask, fairness_key over 1000 tenants",
    }
    base_rate = rates["celery"][0]
    for variant, (rate, publish_s) in rates.items():
        print(f"| {labels[variant]} | {rate} | {rate / base_rate:.2f} | {publish_s:.2f} |")


if __name__ == "__main__":
    main()
