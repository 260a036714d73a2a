"""What worker heartbeats cost, and how long an idle worker without them stays "online".

``python ops/flower/heartbeat_cost.py [--seconds 60] [--expiry]`` from the repository root.
One private ``redis-server`` on loopback; each variant is an idle real worker (prefork -c 2,
``tests.support.flower_app``, started by ``WorkerProcess``) on its own Redis database:

- ``no-heartbeat``   ``--without-heartbeat`` (the profiles before issue 10)
- ``heartbeat``      the profiles now: Celery's default interval, 2 s
- ``heartbeat-10s``  ``--heartbeat-interval 10``
- ``enable-events``  heartbeats plus what Flower does by default and the platform turns off:
                     an ``enable_events`` control broadcast every 5 s

For each, over the same window: the events received per minute (an ``EventReceiver``, as
Flower's), and the CPU time (utime + stime, /proc) of the worker's main process and of its
pool children. ``--expiry`` also measures how long ``celery.events.state`` (what Flower
shows) keeps a worker without heartbeats "online" after its last task.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jobs_platform.testing import RedisServer, WorkerProcess, wait_for  # noqa: E402

APP = "tests.support.flower_app"
TICK = os.sysconf("SC_CLK_TCK")
VARIANTS: dict[str, list[str]] = {
    "no-heartbeat": ["--without-heartbeat"],
    "heartbeat": [],
    "heartbeat-10s": ["--heartbeat-interval", "10"],
    "enable-events": [],
}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime (fields 14 and 15)


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def app_for(url: str) -> Any:
    os.environ["JOBS_BROKER_URL"] = url
    from jobs_platform import create_app

    return create_app("heartbeat-cost", broker_url=url)


class EventCounter(threading.Thread):
    """Counts the events of one Redis database, by hostname and type (Flower's receiver)."""

    def __init__(self, app: Any, state: Any = None) -> None:
        super().__init__(daemon=True)
        self.app = app
        self.state = state
        self.counts: Counter[tuple[str, str]] = Counter()
        self.ready = threading.Event()
        self.lock = threading.Lock()

    def on_event(self, event: dict[str, Any]) -> None:
        with self.lock:
            self.counts[(event.get("hostname", ""), event["type"])] += 1
            if self.state is not None:
                self.state.event(event)

    def run(self) -> None:
        ready = self.ready

        class Receiver(self.app.events.Receiver):  # type: ignore[misc,name-defined]
            def on_consume_ready(self, *args: Any, **kwargs: Any) -> None:
                super().on_consume_ready(*args, **kwargs)
                ready.set()

        # The private redis-server goes away at the end of the run: so does this thread.
        with contextlib.suppress(Exception), self.app.connection() as conn:
            Receiver(conn, handlers={"*": self.on_event}, app=self.app).capture(
                limit=None, timeout=None, wakeup=False
            )


@contextlib.contextmanager
def worker(url: str, extra: list[str], log_dir: str) -> Iterator[WorkerProcess]:
    env = {"JOBS_BROKER_URL": url, "PYTHONPATH": str(ROOT)}
    proc = WorkerProcess(
        APP, ["fast", "heavy"], concurrency=2, env=env, extra_args=extra, cwd=ROOT, log_dir=log_dir
    )
    with proc:
        yield proc


def measure_cost(server: RedisServer, seconds: float, log_dir: str) -> None:
    with contextlib.ExitStack() as stack:
        runs = []
        for db, (name, extra) in enumerate(VARIANTS.items(), start=1):
            url = f"redis://127.0.0.1:{server.port}/{db}"
            app = app_for(url)
            counter = EventCounter(app)
            counter.start()
            counter.ready.wait(10)
            proc = stack.enter_context(worker(url, extra, log_dir))
            runs.append((name, app, counter, proc))
        time.sleep(5)  # past start-up (worker-online, first pidbox traffic)
        stop = threading.Event()
        enabler = next(app for name, app, _, _ in runs if name == "enable-events")

        def broadcast() -> None:  # Flower's Events.on_enable_events timer, every 5 s
            while not stop.wait(5):
                enabler.control.enable_events()

        threading.Thread(target=broadcast, daemon=True).start()
        before = {}
        for name, _, counter, proc in runs:
            assert proc.process is not None
            pid = proc.process.pid
            with counter.lock:
                events = sum(counter.counts.values())
            before[name] = (cpu_seconds(pid), sum(map(cpu_seconds, children(pid))), events)
        started = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - started
        stop.set()
        print(f"idle workers, prefork -c 2, {elapsed:.0f} s window ({TICK} ticks/s)")
        print(f"{'variant':<15}{'events/min':>11}{'main CPU ms/min':>17}{'children ms/min':>17}")
        for name, _, counter, proc in runs:
            assert proc.process is not None
            pid = proc.process.pid
            main0, kids0, events0 = before[name]
            with counter.lock:
                events = sum(counter.counts.values()) - events0
            main = (cpu_seconds(pid) - main0) * 60_000 / elapsed
            kids = (sum(map(cpu_seconds, children(pid))) - kids0) * 60_000 / elapsed
            print(f"{name:<15}{events * 60 / elapsed:>11.1f}{main:>17.1f}{kids:>17.1f}")


def measure_expiry(server: RedisServer, log_dir: str) -> None:
    from celery.events.state import State

    url = f"redis://127.0.0.1:{server.port}/9"
    app = app_for(url)
    state = State()
    counter = EventCounter(app, state)
    counter.start()
    counter.ready.wait(10)
    with worker(url, ["--without-heartbeat"], log_dir) as proc:
        time.sleep(3)
        with counter.lock:
            listed = proc.hostname in state.workers
        print(f"without heartbeats, before any task: listed by the event state: {listed}")
        result = app.send_task("flower.invoice", ("acme", 1), queue="fast")
        result.get(timeout=30)
        done = time.monotonic()

        def alive() -> bool:
            with counter.lock:
                worker = state.workers.get(proc.hostname)
                return bool(worker and worker.alive)

        wait_for(alive, timeout_s=10, message="the worker to show online after its task")
        with counter.lock:
            freq = state.workers[proc.hostname].freq
        wait_for(lambda: not alive(), timeout_s=300, interval_s=0.5, message="offline")
        print(
            f"without heartbeats: freq {freq} s (the event state's default), shown offline "
            f"{time.monotonic() - done:.1f} s after its last task while the process still ran "
            f"(alive: {proc.alive})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--expiry", action="store_true", help="also measure the offline window")
    args = parser.parse_args()
    import tempfile

    log_dir = tempfile.mkdtemp(prefix="heartbeat-cost-")
    with RedisServer() as server:
        measure_cost(server, args.seconds, log_dir)
        if args.expiry:
            measure_expiry(server, log_dir)
    print(f"worker logs: {log_dir}")


if __name__ == "__main__":
    main()
