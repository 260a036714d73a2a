"""Brokers side by side: RabbitMQ vs Redis, the platform vs bare Celery on RabbitMQ, the cost
of ``confirm_publish`` and of a three-node cluster (issue 19).

``python -m bench.brokers`` (``make bench``, ~3-4 min). Every variant is a real ``celery
worker`` subprocess started once and kept for the whole run; every RabbitMQ variant on the
machine's node has a vhost of its own (``rabbitmq_vhost()``, deleted at the end), the Redis
one a private ``redis-server`` on loopback (which also holds the marks, the gates and the
RabbitMQ variants' coordination databases), the cluster ones a private three-node
``RabbitCluster`` (the machine's node is never touched):

1. ``rmq-default``  bare Celery, its defaults, on the machine's RabbitMQ: a **classic** queue
                    ``celery`` on a direct exchange, no publisher confirms, acks early, prefetch
                    4 (global QoS), prefork -c 2
2. ``rmq-fast``     ``ReliableTask`` on ``create_app``, the ``fast`` profile as ``worker_argv``
                    builds it (prefork -c 4, prefetch 1, acks late), on the same RabbitMQ: a
                    **quorum** queue (1 member), topic exchange, ``confirm_publish`` on
3. ``redis-fast``   the same app and worker on Redis (private ``redis-server``)
4. ``cluster3``     2 on a three-node cluster: ``fast`` a quorum queue with 3 members, the
                    worker and producer connected with the ``;``-separated node list
5. ``cluster1``     2 on the same cluster, its ``fast`` queue shrunk to 1 member (on the node
                    both connect to): what replication alone costs, the nodes being the same

How a round is measured: RabbitMQ has no atomic MOVE, so a worker is held still instead of
its queue being filled behind its back: one *gate* task per pool process blocks on a Redis
key; the round's N tasks are published behind the gates (that loop, timed, is the publish
rate: ``delay()`` through the variant's app, confirms included where the app uses them); then
the gates open. The first K tasks record ``time.time()`` when their body starts, the last K
when it ends; throughput is N / (last end - first start). Every round runs every variant, the
order reversed every other round (ABBA); a ratio is the median of the per-round ratios.

``confirm_publish`` alone: a Celery app with the platform's RabbitMQ configuration
(``celery_config``: the quorum queue ``fast``, JSON, its exchange) publishes N tasks with
``confirm_publish`` on, then off, into a vhost of its own with no consumer (purged after each
batch), both back to back in every round.

Results go to ``bench/results/brokers.json``; every ratio is information (no targets).
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
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import celery
import kombu
import redis
from celery import Celery

from bench.apps._marks import END, GATE, START
from bench.throughput import _Worker, baseline_argv, group_cpu_s, profile_argv, source_state
from jobs_platform.app import celery_config
from jobs_platform.brokers.rabbitmq.declare import declare_topology
from jobs_platform.profiles import PROFILES
from jobs_platform.routing import Router
from jobs_platform.settings import Settings
from jobs_platform.testing import RedisServer, wait_for
from jobs_platform.testing.rabbitmq import rabbitmq_vhost, rabbitmqctl
from jobs_platform.testing.rabbitmq_cluster import RabbitCluster, unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("noop", "sleep2ms")
MARKS_DB = 0
#: Redis databases: the Redis variant's broker; each RabbitMQ variant's coordination.
REDIS_BROKER_DB = 1
COORDINATION_DB = {"rmq-fast": 2, "cluster3": 3, "cluster1": 4, "publish": 5}

#: (ratio key, numerator, denominator, what it answers) printed and written in this order.
PAIRS: tuple[tuple[str, str, str, str], ...] = (
    ("rmq-fast/rmq-default", "rmq-fast", "rmq-default", "fast profile vs bare Celery, RabbitMQ"),
    ("redis-fast/rmq-fast", "redis-fast", "rmq-fast", "Redis vs RabbitMQ, fast profile"),
    ("cluster3/rmq-fast", "cluster3", "rmq-fast", "3-node cluster vs the machine's node"),
    ("cluster3/cluster1", "cluster3", "cluster1", "3 members vs 1, same cluster"),
)
CONFIRM_PAIR = ("confirm-on", "confirm-off")


@dataclasses.dataclass
class Variant:
    key: str
    label: str
    module: str
    queue: str
    processes: int  # pool processes: one gate each
    argv: Callable[[str], list[str]]  # hostname -> argv
    broker_url: str
    coordination_url: str | None
    broker_pids: Callable[[], list[int]]  # the broker's processes (CPU per task)
    worker: _Worker | None = None
    app: Any = None
    tasks: dict[str, Any] = dataclasses.field(default_factory=dict)


# -- pure: the ratio table ------------------------------------------------------------------


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> dict[str, Any]:
    """The median of the per-round ratios a[i] / b[i] (each round ran a and b close together
    under the same background load), their interquartile range, and the ratio of medians."""
    if not a or len(a) != len(b):
        raise ValueError(f"need as many rounds of each, got {len(a)} and {len(b)}")
    per_round = [x / y for x, y in zip(a, b, strict=True)]
    # "inclusive": with few rounds the quartiles stay within the measured values.
    lo = hi = per_round[0]
    if len(per_round) > 1:
        lo, _, hi = statistics.quantiles(per_round, n=4, method="inclusive")
    return {
        "median_of_round_ratios": round(statistics.median(per_round), 3),
        "iqr": [round(lo, 3), round(hi, 3)],
        "of_medians": round(statistics.median(a) / statistics.median(b), 3),
        "round_ratios": [round(x, 3) for x in per_round],
    }


def ratio_table(
    samples: Mapping[str, Mapping[str, Sequence[float]]],
    pairs: Sequence[tuple[str, str, str, str]],
    kinds: Sequence[str],
) -> dict[str, dict[str, Any]]:
    """``{"a/b:kind": paired_ratio}`` for every pair whose two variants were measured
    (``samples[variant][kind]``: one value per round); a pair with a variant missing is left
    out (``--no-cluster``)."""
    table = {}
    for key, a, b, _ in pairs:
        if a in samples and b in samples:
            for kind in kinds:
                table[f"{key}:{kind}"] = paired_ratio(samples[a][kind], samples[b][kind])
    return table


# -- broker processes (their CPU per task) ---------------------------------------------------


def proc_cpu_s(pids: Sequence[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` (all their threads)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def machine_rabbit_pids() -> list[int]:
    """The machine's RabbitMQ ``beam.smp`` (asked once; [] when it cannot be told)."""
    try:
        return [int(rabbitmqctl("eval", "list_to_integer(os:getpid()).").strip())]
    except (RuntimeError, OSError, ValueError):
        return []


# -- the run ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, server: RedisServer, log_dir: str) -> None:
        self.port = server.port
        assert server.process is not None
        self.redis_pid = server.process.pid
        self.redis_url = f"redis://127.0.0.1:{server.port}"
        self.marks = redis.Redis(port=server.port, db=MARKS_DB)
        self.log_dir = log_dir
        self.token = uuid.uuid4().hex[:6]

    def env(self, v: Variant) -> dict[str, str]:
        env = {
            "BENCH_BROKER_URL": v.broker_url,
            "BENCH_MARKS_URL": f"{self.redis_url}/{MARKS_DB}",
            # The dead-letter bootstep migrates this database at start: keep it private.
            "JOBS_DATABASE_URL": f"sqlite:///{self.log_dir}/jobs-{v.key}.sqlite3",
            "JOBS_TASK_EVENTS": "auto",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        if v.coordination_url:
            env["JOBS_COORDINATION_URL"] = v.coordination_url
        return env

    def start(self, variants: Sequence[Variant]) -> None:
        for v in variants:
            module = importlib.import_module(v.module)
            extra = {"coordination_url": v.coordination_url} if v.coordination_url else {}
            v.app, v.tasks = module.make_app(v.broker_url, **extra)
            hostname = f"{v.key}-{self.token}@bench"
            v.worker = _Worker(
                v.argv(hostname),
                env=self.env(v),
                hostname=hostname,
                cwd=str(ROOT),
                log_dir=self.log_dir,
            )
            v.worker.start(wait=False)  # readiness = the warm-up round completing

    def stop(self, variants: Sequence[Variant]) -> None:
        for v in variants:
            if v.worker is not None:
                v.worker.stop()
            if v.app is not None:
                v.app.close()

    def _alive(self, v: Variant) -> None:
        assert v.worker is not None
        if not v.worker.alive:
            raise RuntimeError(f"worker {v.key} exited:\n{v.worker.log()[-3000:]}")

    def measure(
        self, v: Variant, kind: str, n: int, tag: str, marks: int, timeout_s: float
    ) -> dict[str, float]:
        """Tasks/s end to end, publish rate, worker and broker CPU ms per task, for ``n``
        tasks published behind closed gates."""
        assert v.worker is not None and v.worker.process is not None
        k = max(1, min(marks, n // 4))
        prefix = f"bench:{tag}:{v.key}:{kind}"
        gate = f"{prefix}:{GATE}"
        task = v.tasks[kind]
        with v.app.producer_or_acquire() as producer:
            for _ in range(v.processes):
                v.tasks["noop"].apply_async((gate,), producer=producer)
            # Every pool process holds a gate before the round is published, so none of the
            # round runs early (an unheld process would start on it while it is published).
            wait_for(
                lambda: (self._alive(v), self.marks.llen(f"{gate}:held") >= v.processes)[1],
                timeout_s=timeout_s,
                interval_s=0.005,
                message=f"{v.key}: every pool process to hold a gate",
            )
            began = time.perf_counter()
            for i in range(n):
                mark = f"{prefix}:{START}" if i < k else f"{prefix}:{END}" if i >= n - k else None
                task.apply_async((mark,), producer=producer)
            published = time.perf_counter() - began
        cpu0 = group_cpu_s(v.worker.process.pid), proc_cpu_s(v.broker_pids())
        self.marks.rpush(gate, *["go"] * v.processes)
        wait_for(
            lambda: (self._alive(v), self.marks.llen(f"{prefix}:{END}") >= k)[1],
            timeout_s=timeout_s,
            interval_s=0.005,
            message=f"{v.key}/{kind} to finish {n}",
        )
        cpu1 = group_cpu_s(v.worker.process.pid), proc_cpu_s(v.broker_pids())
        starts = [float(x) for x in self.marks.lrange(f"{prefix}:{START}", 0, -1)]
        ends = [float(x) for x in self.marks.lrange(f"{prefix}:{END}", 0, -1)]
        self.marks.delete(f"{prefix}:{START}", f"{prefix}:{END}", gate, f"{gate}:held")
        return {
            "tasks_per_s": n / (max(ends) - min(starts)),
            "publish_per_s": n / published,
            "worker_cpu_ms": (cpu1[0] - cpu0[0]) * 1000 / n,
            "broker_cpu_ms": (cpu1[1] - cpu0[1]) * 1000 / n,
        }


def publisher_app(url: str, coordination_url: str, confirm: bool) -> Any:
    """A Celery app with the platform's RabbitMQ configuration (the quorum queue ``fast`` on
    its topic exchange, JSON), ``confirm_publish`` as given: the platform's own app refuses
    it off (``check_live``), which is the point; this one measures what it buys."""
    settings = Settings.load(broker_url=url, coordination_url=coordination_url)
    app = Celery(f"bench_confirm_{'on' if confirm else 'off'}", set_as_current=False)
    config = celery_config(settings, Router(settings.routes))
    config["broker_transport_options"] = {
        **config.get("broker_transport_options", {}),
        "confirm_publish": confirm,
    }
    app.config_from_object(config)

    @app.task(name="bench.noop", ignore_result=True, shared=False)
    def noop(mark: str | None = None) -> None:
        return None

    app.finalize()
    return app


class ConfirmCost:
    """Publish rate into a quorum queue nobody consumes, confirms on and off."""

    def __init__(self, url: str, coordination_url: str) -> None:
        self.apps = {
            "confirm-on": publisher_app(url, coordination_url, True),
            "confirm-off": publisher_app(url, coordination_url, False),
        }
        app = self.apps["confirm-on"]
        with app.connection_for_write() as conn:
            declare_topology(conn, app.conf.task_queues)

    def measure(self, key: str, n: int) -> float:
        app = self.apps[key]
        noop = app.tasks["bench.noop"]
        with app.producer_or_acquire() as producer:
            noop.apply_async((None,), producer=producer)  # connection and declarations made
            began = time.perf_counter()
            for _ in range(n):
                noop.apply_async((None,), producer=producer)
            rate = n / (time.perf_counter() - began)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge("fast")
        return rate

    def close(self) -> None:
        for app in self.apps.values():
            app.close()


# -- the cluster -----------------------------------------------------------------------------


def shrink_to_one(cluster: RabbitCluster, vhost: str, queue: str, keep: str) -> list[str]:
    """Leave quorum queue ``queue`` with its member on node ``keep`` only; its members after."""
    for node in cluster.members_of(queue, vhost):
        if node != keep:
            cluster.ctl(
                "eval",
                f'rabbit_quorum_queue:delete_member(<<"{vhost}">>, <<"{queue}">>, \'{node}\').',
            )
    return cluster.members_of(queue, vhost)


def declare_platform_topology(url: str, coordination_url: str) -> None:
    """Declare what the platform's worker declares (so its members can be changed first)."""
    app = publisher_app(url, coordination_url, True)
    try:
        with app.connection_for_write() as conn:
            declare_topology(conn, app.conf.task_queues)
    finally:
        app.close()


# -- report ----------------------------------------------------------------------------------


def summarise(samples: dict[str, Any], confirm: dict[str, list[float]]) -> dict[str, Any]:
    def medians(name: str) -> dict[str, dict[str, float]]:
        return {
            key: {kind: round(statistics.median(xs), 2) for kind, xs in per.items()}
            for key, per in samples[name].items()
        }

    out: dict[str, Any] = {
        "median_tasks_per_s": medians("tasks_per_s"),
        "median_publish_per_s": medians("publish_per_s"),
        "median_worker_cpu_ms_per_task": medians("worker_cpu_ms"),
        "median_broker_cpu_ms_per_task": medians("broker_cpu_ms"),
        "ratios": ratio_table(samples["tasks_per_s"], PAIRS, KINDS),
        "publish_ratios": ratio_table(samples["publish_per_s"], PAIRS, KINDS),
    }
    if confirm and all(confirm.values()):
        out["confirm_publish"] = {
            "median_publish_per_s": {k: round(statistics.median(v), 1) for k, v in confirm.items()},
            "on/off": paired_ratio(confirm[CONFIRM_PAIR[0]], confirm[CONFIRM_PAIR[1]]),
        }
    return out


def print_report(result: dict[str, Any]) -> None:
    s, cfg = result["summary"], result["config"]
    print(
        f"\nPer variant, median of {cfg['rounds']} rounds of {cfg['tasks']} tasks: "
        "tasks/s end to end [min-max], publish/s (delay() loop), worker / broker CPU ms per task"
    )
    for key, v in result["variants"].items():
        print(f"  {key:<12} {v['label']}")
        for kind in KINDS:
            xs = result["samples"]["tasks_per_s"][key][kind]
            print(
                f"    {kind:<9} {s['median_tasks_per_s'][key][kind]:7.0f} "
                f"[{min(xs):5.0f}-{max(xs):5.0f}] tasks/s  "
                f"publish {s['median_publish_per_s'][key][kind]:6.0f}/s  "
                f"CPU {s['median_worker_cpu_ms_per_task'][key][kind]:5.2f} / "
                f"{s['median_broker_cpu_ms_per_task'][key][kind]:5.2f} ms"
            )
    print(f"\n{'ratio: median of per-round ratios [IQR]':<56} {'no-op':>22} {'sleep 2 ms':>22}")
    for table, what in (("ratios", "tasks/s"), ("publish_ratios", "publish/s")):
        for key, _, _, label in PAIRS:
            cells = []
            for kind in KINDS:
                r = s[table].get(f"{key}:{kind}")
                cells.append(
                    "-"
                    if r is None
                    else f"{r['median_of_round_ratios']:.3f} [{r['iqr'][0]:.2f}-{r['iqr'][1]:.2f}]"
                )
            print(f"{what + ' ' + key:<34} {label:<42} {cells[0]:>22} {cells[1]:>22}")
    if "confirm_publish" in s:
        c = s["confirm_publish"]
        r = c["on/off"]
        on, off = (c["median_publish_per_s"][k] for k in CONFIRM_PAIR)
        print(
            f"\nconfirm_publish, quorum queue, publish/s: on {on:.0f}, off {off:.0f}; "
            f"on/off {r['median_of_round_ratios']:.3f} [{r['iqr'][0]:.2f}-{r['iqr'][1]:.2f}]"
        )
    if result.get("cluster"):
        print(f"\ncluster: {result['cluster']}")
    print(f"load average: start {cfg['loadavg_start']}, end {result['machine']['loadavg_end']}")


# -- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.brokers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tasks", type=int, default=300, help="tasks per variant, kind and round")
    p.add_argument("--rounds", type=int, default=4, help="measured rounds (after one warm-up)")
    p.add_argument("--publish", type=int, default=400, help="messages per confirm batch")
    p.add_argument("--marks", type=int, default=20, help="tasks that record at each end")
    p.add_argument("--no-cluster", action="store_true", help="skip the three-node cluster")
    p.add_argument("--quick", action="store_true", help="100 tasks, 2 rounds, no cluster")
    p.add_argument("--loglevel", default="WARNING")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "brokers.json"))
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.rounds, args.publish, args.no_cluster = 100, 2, 200, True
    if args.tasks < 8 or args.rounds < 1:
        p.error("--tasks must be >= 8 and --rounds >= 1")
    return args


def make_variants(
    bench: Bench,
    loglevel: str,
    vhosts: Mapping[str, str],
    cluster: RabbitCluster | None,
    cluster_urls: Mapping[str, str],
) -> list[Variant]:
    fast = PROFILES["fast"]
    coordination = {k: f"{bench.redis_url}/{db}" for k, db in COORDINATION_DB.items()}
    machine = machine_rabbit_pids()
    fast_label = f"prefork -c {fast.concurrency}, prefetch {fast.prefetch_multiplier}"

    def variant(
        key: str, label: str, url: str, pids: Callable[[], list[int]], coordinated: bool = True
    ) -> Variant:
        return Variant(
            key,
            label,
            "bench.apps.reliable",
            "fast",
            fast.concurrency,
            profile_argv("bench.apps.reliable", "fast", loglevel),
            url,
            coordination[key] if coordinated else None,
            pids,
        )

    variants = [
        Variant(
            "rmq-default",
            "bare Celery defaults, RabbitMQ: classic queue, no confirms, acks early, "
            "prefetch 4, prefork -c 2",
            "bench.apps.default",
            "celery",
            2,
            baseline_argv("bench.apps.default", "celery", loglevel),
            vhosts["rmq-default"],
            None,
            lambda: machine,
        ),
        variant(
            "rmq-fast",
            f"ReliableTask, fast profile ({fast_label}), RabbitMQ quorum queue, confirms",
            vhosts["rmq-fast"],
            lambda: machine,
        ),
        variant(
            "redis-fast",
            f"ReliableTask, fast profile ({fast_label}), Redis",
            f"{bench.redis_url}/{REDIS_BROKER_DB}",
            lambda: [bench.redis_pid],
            coordinated=False,
        ),
    ]
    if cluster is not None:

        def beams() -> list[int]:
            return [pid for node in cluster.nodes for pid in cluster.beam_pids(node)]

        variants += [
            variant(
                "cluster3",
                "2 on a three-node cluster: quorum queue with 3 members",
                cluster_urls["cluster3"],
                beams,
            ),
            variant(
                "cluster1",
                "2 on the same cluster: its queue shrunk to 1 member",
                cluster_urls["cluster1"],
                beams,
            ),
        ]
    return variants


@contextlib.contextmanager
def maybe_cluster(skip: bool) -> Iterator[RabbitCluster | None]:
    reason = "skipped (--no-cluster)" if skip else unavailable_reason()
    if reason is not None:
        print(f"three-node cluster: {reason}", flush=True)
        yield None
        return
    with RabbitCluster(prefix="jb") as cluster:
        yield cluster


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    loadavg_start = os.getloadavg()
    names = ("tasks_per_s", "publish_per_s", "worker_cpu_ms", "broker_cpu_ms")
    confirm: dict[str, list[float]] = {k: [] for k in CONFIRM_PAIR}
    result: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        log_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="jobs-bench-brokers-"))
        server = stack.enter_context(RedisServer())
        bench = Bench(server, log_dir)
        vhosts = {
            key: stack.enter_context(rabbitmq_vhost("jobs-bench"))
            for key in ("rmq-default", "rmq-fast", "publish")
        }
        t0 = time.monotonic()
        cluster = stack.enter_context(maybe_cluster(args.no_cluster))
        cluster_urls: dict[str, str] = {}
        if cluster is not None:
            first = cluster.nodes[0].name
            for key in ("cluster3", "cluster1"):
                vhost = f"bench-{key}"
                # The node list starting at the first node: producer and worker both reach
                # the queue's leader (declared from there) directly.
                cluster_urls[key] = cluster.add_vhost(vhost).failover_from(first)
                declare_platform_topology(
                    cluster_urls[key], f"{bench.redis_url}/{COORDINATION_DB[key]}"
                )
            members = shrink_to_one(cluster, "bench-cluster1", "fast", keep=first)
            result["cluster"] = {
                "nodes": len(cluster.nodes),
                "ready_s": round(time.monotonic() - t0, 1),
                "timings": str(cluster.timings),
                "cluster3_fast": {
                    "leader": cluster.leader_of("fast", "bench-cluster3"),
                    "members": cluster.members_of("fast", "bench-cluster3"),
                },
                "cluster1_fast": {
                    "leader": cluster.leader_of("fast", "bench-cluster1"),
                    "members": members,
                },
            }
            print(f"cluster ready: {result['cluster']}", flush=True)
        variants = make_variants(bench, args.loglevel, vhosts, cluster, cluster_urls)
        samples: dict[str, Any] = {
            name: {v.key: {k: [] for k in KINDS} for v in variants} for name in names
        }
        stack.callback(bench.stop, variants)
        bench.start(variants)
        confirm_cost = ConfirmCost(
            vhosts["publish"], f"{bench.redis_url}/{COORDINATION_DB['publish']}"
        )
        stack.callback(confirm_cost.close)
        timeout = 120 + args.tasks / 20
        for v in variants:  # warm-up, and readiness: a worker is up once it has run tasks
            for kind in KINDS:
                bench.measure(v, kind, max(40, args.tasks // 5), "warm", args.marks, 180)
        for key in CONFIRM_PAIR:
            confirm_cost.measure(key, max(50, args.publish // 5))
        print(f"workers warm after {time.monotonic() - started:.0f} s", flush=True)
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for kind in KINDS:
                for v in order:
                    values = bench.measure(v, kind, args.tasks, f"r{r}", args.marks, timeout)
                    for name in names:
                        samples[name][v.key][kind].append(values[name])
                    print(
                        f"round {r + 1}/{args.rounds} {kind:<8} {v.key:<11} "
                        f"{values['tasks_per_s']:7.1f} tasks/s  "
                        f"publish {values['publish_per_s']:6.0f}/s  "
                        f"CPU {values['worker_cpu_ms']:5.2f} / {values['broker_cpu_ms']:5.2f} ms",
                        flush=True,
                    )
            for key in CONFIRM_PAIR if r % 2 == 0 else CONFIRM_PAIR[::-1]:
                rate = confirm_cost.measure(key, args.publish)
                confirm[key].append(rate)
                print(f"round {r + 1}/{args.rounds} publish  {key:<11} {rate:7.0f}/s", flush=True)
        labels = {v.key: {"label": v.label, "argv": v.argv(f"{v.key}@bench")[2:]} for v in variants}
    return {
        "benchmark": "jobs-platform brokers",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {
            "tasks": args.tasks,
            "rounds": args.rounds,
            "publish": args.publish,
            "marks": args.marks,
            "loadavg_start": [round(x, 2) for x in loadavg_start],
            "method": "one gate task per pool process holds the worker; the round is published "
            "behind the gates (timed: publish rate), then the gates open; N / (last end - first "
            "start); ignore_result=True; variants in every round, order reversed every other "
            "round; ratio = median of per-round ratios",
        },
        "source": source_state(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "celery": celery.__version__,
            "kombu": kombu.__version__,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        },
        "variants": labels,
        "samples": {
            name: {
                k: {kk: [round(x, 3) for x in xs] for kk, xs in m.items()} for k, m in per.items()
            }
            for name, per in samples.items()
        },
        "confirm_samples": {k: [round(x, 1) for x in v] for k, v in confirm.items()},
        "summary": summarise(samples, confirm),
        **result,
        "duration_s": round(time.monotonic() - started, 1),
    }


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
