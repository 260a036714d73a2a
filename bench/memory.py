"""Idle memory of the three per-queue workers, as ``worker_argv`` starts them.

``python -m bench.memory`` (``make bench``). One private ``redis-server``; the ``fast``,
``heavy`` and ``thirdparty`` workers of the same app (``bench/apps/reliable.py``:
``ReliableTask`` on ``create_app``) are started together exactly as ``worker-profile QUEUE``
starts them, left idle ``--settle`` seconds after "ready", and measured: PSS and RSS from
``/proc/<pid>/smaps_rollup``, summed over each worker's process tree (main process and pool
children). PSS splits pages shared between processes (a prefork child shares most of its
parent's memory) among them, so it adds up across processes; it is closest to what a
container's memory limit counts. RSS counts shared pages once per process.

For comparison (information, not part of the total): one bare Celery worker with its
defaults (prefork -c 2, ``bench/apps/default.py``), and ``fast`` with one process per CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from jobs_platform.profiles import PROFILES, available_cpus, worker_argv
from jobs_platform.testing import RedisServer, WorkerProcess

ROOT = Path(__file__).resolve().parents[1]
TARGET_PSS_MB = 400.0
APP = "bench.apps.reliable"


@dataclasses.dataclass(frozen=True)
class Spec:
    key: str
    label: str
    argv: list[str]  # ``celery ...`` without the interpreter; ``{hostname}`` is filled in
    counted: bool  # part of the per-queue total


def profile_spec(queue: str, concurrency: int | None = None, *, counted: bool = True) -> Spec:
    p = PROFILES[queue]
    conc = concurrency or p.concurrency
    key = queue if concurrency is None else f"{queue}-c{conc}"
    label = f"{queue} ({p.pool} -c {conc})" + ("" if counted else " (info)")
    argv = worker_argv(APP, queue, hostname="{hostname}", concurrency=concurrency)
    return Spec(key, label, argv, counted)


def default_spec() -> Spec:
    argv = ["celery", "-A", "bench.apps.default", "worker", "-Q", "celery", "-P", "prefork"]
    argv += ["-c", "2", "-n", "{hostname}", "-l", "INFO", "--without-gossip", "--without-mingle"]
    return Spec("celery-default", "bare Celery, defaults (prefork -c 2) (info)", argv, False)


# -- /proc -----------------------------------------------------------------------------------


def _parents() -> dict[int, int]:
    """pid -> parent pid of every live process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                out[int(entry.name)] = int(fields[1])
            except (OSError, ValueError, IndexError):
                continue  # the process went away
    return out


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


def tree_memory(pid: int) -> dict[str, Any]:
    """PSS and RSS (MB) summed over ``pid``'s process tree, and per process."""
    rss = pss = 0
    per_process = []
    for member in process_tree(pid):
        try:
            text = (Path("/proc") / str(member) / "smaps_rollup").read_text()
        except OSError:
            continue
        values = {
            line.split(":")[0]: int(line.split()[1])
            for line in text.splitlines()
            if line.startswith(("Rss:", "Pss:"))
        }
        rss += values.get("Rss", 0)
        pss += values.get("Pss", 0)
        per_process.append(
            {
                "pid": member,
                "rss_mb": round(values.get("Rss", 0) / 1024, 1),
                "pss_mb": round(values.get("Pss", 0) / 1024, 1),
            }
        )
    return {
        "processes": len(per_process),
        "rss_mb": round(rss / 1024, 1),
        "pss_mb": round(pss / 1024, 1),
        "per_process": per_process,
    }


# -- measurement -----------------------------------------------------------------------------


def measure_idle(
    specs: list[Spec], *, broker_url: str, log_dir: str, settle_s: float
) -> dict[str, dict[str, Any]]:
    """Start every spec's worker together, wait until all are ready, stay idle, measure."""
    token = uuid.uuid4().hex[:6]
    workers: dict[str, WorkerProcess] = {}
    for i, spec in enumerate(specs):
        hostname = f"{spec.key}-{token}@mem"
        argv = [part.replace("{hostname}", hostname) for part in spec.argv]
        env = {
            "JOBS_BROKER_URL": broker_url,
            "BENCH_BROKER_URL": broker_url,
            "BENCH_MARKS_URL": broker_url,
            "JOBS_DATABASE_URL": f"sqlite:///{log_dir}/jobs-{i}.sqlite3",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        workers[spec.key] = WorkerProcess(
            argv[argv.index("-A") + 1],
            [],
            env=env,
            hostname=hostname,
            cwd=str(ROOT),
            log_dir=log_dir,
            argv=[sys.executable, "-m", *argv],
        )
    try:
        for w in workers.values():
            w.start(wait=False)
        for w in workers.values():
            w.wait_ready(120)
        time.sleep(settle_s)
        out = {}
        for spec in specs:
            proc = workers[spec.key].process
            assert proc is not None
            out[spec.key] = {"label": spec.label, "counted": spec.counted, **tree_memory(proc.pid)}
        return out
    finally:
        for w in workers.values():
            w.stop()


def summarise(measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    counted = [m for m in measured.values() if m["counted"]]
    pss = round(sum(m["pss_mb"] for m in counted), 1)
    return {
        "total_pss_mb": pss,
        "total_rss_mb": round(sum(m["rss_mb"] for m in counted), 1),
        "target_pss_mb": TARGET_PSS_MB,
        "pass": pss <= TARGET_PSS_MB,
    }


def print_report(result: dict[str, Any]) -> None:
    print(f"\nIdle memory, {result['config']['settle_s']:g} s after ready (process tree)")
    print(f"{'worker':<46} {'procs':>5} {'PSS MB':>8} {'RSS MB':>8}")
    for m in result["workers"].values():
        print(f"{m['label']:<46} {m['processes']:>5} {m['pss_mb']:8.1f} {m['rss_mb']:8.1f}")
    s = result["summary"]
    print(
        f"{'three per-queue workers':<46} {'':>5} {s['total_pss_mb']:8.1f} "
        f"{s['total_rss_mb']:8.1f}   PSS target <= {s['target_pss_mb']:g} MB: "
        f"{'met' if s['pass'] else 'MISSED'}"
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    specs = [profile_spec(queue) for queue in PROFILES]
    if not args.no_info:
        specs.append(default_spec())
        cpus = available_cpus()
        if cpus != PROFILES["fast"].concurrency:
            specs.append(profile_spec("fast", cpus, counted=False))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jobs-mem-") as log_dir, RedisServer() as server:
        measured = measure_idle(specs, broker_url=server.url, log_dir=log_dir, settle_s=args.settle)
    return {
        "benchmark": "jobs-platform idle memory",
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": {"app": APP, "settle_s": args.settle, "cpus_available": available_cpus()},
        "workers": measured,
        "summary": summarise(measured),
        "duration_s": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--settle", type=float, default=5.0, help="seconds idle after ready")
    p.add_argument("--no-info", action="store_true", help="only the three per-queue workers")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "memory.json"))
    args = p.parse_args(argv)
    result = run(args)
    print_report(result)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {out} ({result['duration_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
