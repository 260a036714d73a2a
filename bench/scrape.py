"""What the metrics cost: a scrape from 0 to 1,000,000 queued jobs, and recording per task.

``python -m bench.scrape`` (``--quick`` for a CI-size run). One private ``redis-server``
on loopback and a fresh SQLite dead-letter table (1,000 rows):

1. **Scrape.** Real kombu messages (one published through ``ReliableTask``, so it carries
   the enqueue stamp) are copied with raw ``LPUSH`` in pipelines into ``fast`` (spread over
   its four priority sub-lists) and ``heavy`` until the backlog is 0, 10k, 100k and 1M,
   with 100 messages in flight (kombu's ``unacked`` structures) and 200 counter series
   throughout. At each level the exporter's whole collection (``generate_latest`` of its
   registry: Redis and the database) is timed ``--scrapes`` times after one warm-up; the
   median and the worst are reported, and the ratio of the 1M median to the 0 median.
2. **Recording.** The per-task cost of counting outcomes in a pool process: the signals
   a successful task fires (``task_prerun``, ``task_success``, ``task_postrun``) plus the
   main process's ``task_received``, sent ``--tasks`` times with the metrics receivers
   connected and recording on (its flush thread writing to the private Redis), minus the
   same sends with the receivers disconnected. Also: one flush of 200 series.

Writes ``bench/results/scrape.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import types
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from celery import signals
from prometheus_client import generate_latest

from jobs_platform import ReliableTask, create_app
from jobs_platform import db as platform_db
from jobs_platform.brokers.redis.layout import BrokerLayout
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.metrics import counters, exporter, outcomes
from jobs_platform.settings import Settings
from jobs_platform.testing import RedisServer, dead_letter

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (0, 10_000, 100_000, 1_000_000)
PIPELINE = 10_000
INFLIGHT = 100
SERIES = 200
FLUSH_INTERVAL_S = Settings().metrics_flush_interval


def fill_to(client: redis.Redis, layout: BrokerLayout, message: bytes, want: int) -> None:
    """LPUSH copies of ``message`` until ``want`` are queued, spread evenly over fast's
    four priority sub-lists and heavy."""
    keys = [*layout.sublists("fast"), "heavy"]
    remaining = want - queued(client, layout)
    while remaining > 0:
        batch = min(PIPELINE, remaining)
        share, extra = divmod(batch, len(keys))
        pipe = client.pipeline(transaction=False)
        for n, key in enumerate(keys):
            count = share + (1 if n < extra else 0)
            if count:
                pipe.lpush(key, *([message] * count))
        pipe.execute()
        remaining -= batch


def queued(client: redis.Redis, layout: BrokerLayout) -> int:
    keys = [*layout.sublists("fast"), *layout.sublists("heavy")]
    return sum(int(client.llen(key)) for key in keys)


def time_scrapes(collect: Callable[[], bytes], count: int) -> dict[str, float]:
    collect()  # warm: connections, the engine, the query plan
    took = []
    for _ in range(count):
        began = time.perf_counter()
        collect()
        took.append((time.perf_counter() - began) * 1000)
    return {
        "median_ms": round(statistics.median(took), 3),
        "max_ms": round(max(took), 3),
        "min_ms": round(min(took), 3),
    }


def prepare(app: Any, client: redis.Redis, database_url: str) -> bytes:
    """A real stamped message, the in-flight entries, the counter series, dead letters."""

    @app.task(base=ReliableTask, name="bench.scrape", queue="fast")
    def sample(n: int) -> None: ...

    sample.delay(1)
    message = client.rpop("fast")
    assert message is not None
    layout = BrokerLayout.from_app(app)
    now = time.time()
    pipe = client.pipeline(transaction=False)
    for n in range(INFLIGHT):
        tag = str(uuid.uuid4())
        pipe.hset(layout.unacked_key, tag, json.dumps([json.loads(message), "fast", "fast"]))
        pipe.zadd(layout.unacked_index_key, {tag: now - n})
    pipe.execute()
    recorder = counters.Recorder(client, interval_s=60)
    for n in range(SERIES):
        recorder.add(("celery_task_succeeded_total", (f"app.task_{n}", "fast")), n + 1)
    recorder.close()
    platform_db.upgrade(database_url)
    store = DeadLetterStore(database_url)
    for n in range(1000):
        store.add(dead_letter(reason=("permanent", "exhausted")[n % 2]))
    return message


def scrape_levels(
    app: Any, client: redis.Redis, message: bytes, scrapes: int, levels: tuple[int, ...]
) -> dict[str, Any]:
    registry = exporter.registry_for(app)
    layout = BrokerLayout.from_app(app)
    results = {}
    for level in levels:
        began = time.perf_counter()
        fill_to(client, layout, message, level)
        fill_s = time.perf_counter() - began
        timing = time_scrapes(lambda: generate_latest(registry), scrapes)
        results[str(level)] = {
            **timing,
            "queued": queued(client, layout),
            "fill_s": round(fill_s, 1),
            "redis_used_memory_mb": round(int(client.info("memory")["used_memory"]) / 2**20, 1),
        }
        print(
            f"  {level:>9,} queued: median {timing['median_ms']:.2f} ms, "
            f"max {timing['max_ms']:.2f} ms"
        )
    return results


class _Task:
    """What the receivers read of a task in a pool process."""

    queue = "fast"

    def __init__(self) -> None:
        self.name = "bench.noop"
        self.request = types.SimpleNamespace(delivery_info={"routing_key": "fast"}, is_eager=False)


def send_task_signals(n: int) -> float:
    """Seconds to fire one successful task's signals ``n`` times."""
    task = _Task()
    received = types.SimpleNamespace(
        task_name=task.name, task=task, delivery_info={"routing_key": "fast"}
    )
    began = time.perf_counter()
    for i in range(n):
        task_id = f"t{i}"
        signals.task_received.send(sender=None, request=received)
        signals.task_prerun.send(sender=task, task_id=task_id, task=task, args=(), kwargs={})
        signals.task_success.send(sender=task, result=None)
        signals.task_postrun.send(
            sender=task,
            task_id=task_id,
            task=task,
            args=(),
            kwargs={},
            retval=None,
            state="SUCCESS",
        )
    return time.perf_counter() - began


def recording_cost(url: str, tasks: int, repeats: int) -> dict[str, Any]:
    receivers = [
        (signals.task_received, "on_task_received"),
        (signals.task_prerun, "on_task_prerun"),
        (signals.task_postrun, "on_task_postrun"),
        (signals.task_success, "on_task_success"),
    ]

    def disconnect() -> None:
        for signal, name in receivers:
            signal.disconnect(dispatch_uid=f"jobs.metrics.{name}")

    without, with_recording = [], []
    for _ in range(repeats):  # interleaved, so drift hits both alike
        disconnect()
        without.append(send_task_signals(tasks))
        outcomes.connect()
        counters.activate(url, interval_s=FLUSH_INTERVAL_S)
        with_recording.append(send_task_signals(tasks))
        counters.deactivate()
    base = statistics.median(without) / tasks * 1e6
    full = statistics.median(with_recording) / tasks * 1e6

    client = redis.Redis.from_url(url)
    recorder = counters.Recorder(client, interval_s=60)
    flushes = []
    for round_ in range(20):
        for n in range(SERIES):
            recorder.add(("celery_task_succeeded_total", (f"app.flush_{n}", "fast")), round_)
        began = time.perf_counter()
        recorder.flush()
        flushes.append((time.perf_counter() - began) * 1000)
    recorder.close()
    return {
        "tasks": tasks,
        "repeats": repeats,
        "signals_without_metrics_us_per_task": round(base, 2),
        "signals_with_metrics_us_per_task": round(full, 2),
        "metrics_cost_us_per_task": round(full - base, 2),
        "flush_of_200_series_ms": round(statistics.median(flushes), 3),
        "flush_interval_s": FLUSH_INTERVAL_S,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.scrape",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scrapes", type=int, default=30, help="timed scrapes per level")
    p.add_argument("--tasks", type=int, default=50_000, help="simulated tasks per repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="levels up to 100k, fewer repeats")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "scrape.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = LEVELS[:3] if args.quick else LEVELS
    started = time.monotonic()
    with RedisServer() as server, tempfile.TemporaryDirectory() as scratch:
        database_url = f"sqlite:///{scratch}/bench.sqlite3"
        app = create_app("benchscrape", broker_url=server.url, database_url=database_url)
        client = redis.Redis.from_url(server.url)
        message = prepare(app, client, database_url)
        print(f"scrape ({args.scrapes} per level, {INFLIGHT} in flight, {SERIES} series):")
        levels_result = scrape_levels(app, client, message, args.scrapes, levels)
        client.flushdb()
        print("recording:")
        recording = recording_cost(
            server.url, args.tasks // (5 if args.quick else 1), 3 if args.quick else args.repeats
        )
        print(
            f"  {recording['metrics_cost_us_per_task']:.1f} us per task "
            f"({recording['signals_without_metrics_us_per_task']:.1f} -> "
            f"{recording['signals_with_metrics_us_per_task']:.1f} us for the signals); "
            f"a flush of {SERIES} series {recording['flush_of_200_series_ms']:.2f} ms"
        )
    top, bottom = levels_result[str(levels[-1])], levels_result[str(levels[0])]
    ratio = top["median_ms"] / bottom["median_ms"]
    print(f"scrape median at {levels[-1]:,} / at {levels[0]:,}: {ratio:.2f}x")
    result = {
        "scrape": {"levels": levels_result, "ratio_top_to_empty": round(ratio, 3)},
        "recording": recording,
        "config": {
            "scrapes": args.scrapes,
            "in_flight": INFLIGHT,
            "series": SERIES,
            "dead_letter_rows": 1000,
            "quick": args.quick,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_end": os.getloadavg(),
        },
        "duration_s": round(time.monotonic() - started, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
