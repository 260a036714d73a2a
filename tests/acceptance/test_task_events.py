"""JOBS_TASK_EVENTS=auto with real workers on the real broker: task events flow only while a
monitor asks for them (Celery's ``enable_events`` broadcast, which Flower repeats every 5 s).

An event receiver in this process plays the monitor. Absence is proven by order, not by
waiting: a worker publishes its events in order on one connection, so once a later task's
``task-succeeded`` has arrived, an earlier task's events would have arrived before it.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

APP = "tests.support.flower_app"
LEASE_S = 3.0


class Monitor:
    """Every event on the broker, in arrival order, from a receiver thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._run, name="test-monitor", daemon=True)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def _on_event(self, event: dict[str, Any]) -> None:
        with self._lock:
            self.events.append(event)

    def seen(self, kind: str, **fields: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [
                e
                for e in self.events
                if e.get("type") == kind and all(e.get(k) == v for k, v in fields.items())
            ]

    def of_task(self, task_id: str) -> list[str]:
        with self._lock:
            return [str(e["type"]) for e in self.events if e.get("uuid") == task_id]

    def __enter__(self) -> Monitor:
        self._thread.start()
        # Listening once an event of our own comes back (the receiver subscribes some time
        # after the thread starts): sent again on every poll until it does.
        probe = uuid.uuid4().hex
        with self.app.events.default_dispatcher() as dispatcher:

            def heard() -> bool:
                dispatcher.send("test-probe", probe=probe)
                return bool(self.seen("test-probe", probe=probe))

            wait_for(heard, timeout_s=30, interval_s=0.2, message="the monitor to listen")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(10)


@pytest.fixture(scope="module")
def events_app(worker_env: dict[str, str]) -> Any:
    from tests.support import flower_app

    return flower_app


@pytest.fixture()
def monitor(events_app: Any) -> Iterator[Monitor]:
    with Monitor(events_app.app) as m:
        yield m


def start_worker(
    env: dict[str, str], tmp: Path, *extra: str, mode: str = "auto", pool: str = "prefork"
) -> WorkerProcess:
    # The profiles' command line (heartbeats on, gossip and mingle off) unless extra says.
    return WorkerProcess(
        APP,
        ["fast"],
        pool=pool,
        concurrency=1 if pool == "prefork" else 10,
        env={**env, "JOBS_TASK_EVENTS": mode, "JOBS_TASK_EVENTS_LEASE": str(LEASE_S)},
        hostname=f"events-{uuid.uuid4().hex[:6]}@eventtest",
        extra_args=list(extra),
        cwd=str(ROOT),
        log_dir=str(tmp),
    )


def run_task(events_app: Any, label: str) -> str:
    result = events_app.invoice.delay(label, 1)
    assert result.get(timeout=30) == f"invoiced {label} 1 EUR"
    return str(result.id)


def ask_for_events(events_app: Any, worker: WorkerProcess) -> list[dict[str, Any]]:
    """One ``enable_events`` as Flower sends it, with replies so the test knows it arrived."""
    replies: list[dict[str, Any]] = events_app.app.control.enable_events(
        destination=[worker.hostname], reply=True, timeout=10
    )
    return replies


def succeeded_event(monitor: Monitor, task_id: str) -> dict[str, Any]:
    return wait_for(
        lambda: next(iter(monitor.seen("task-succeeded", uuid=task_id)), None),
        timeout_s=30,
        message=lambda: f"task-succeeded of {task_id}; seen {monitor.of_task(task_id)}",
    )


@pytest.mark.parametrize("pool", ["prefork", "gevent"])  # event loop / timer thread
def test_auto_sends_task_events_only_while_a_monitor_asks(
    worker_env: dict[str, str], events_app: Any, monitor: Monitor, tmp_path: Path, pool: str
) -> None:
    with start_worker(worker_env, tmp_path, pool=pool) as worker:
        # Worker events go out as Celery sends them: a heartbeat shows the monitor listens.
        wait_for(
            lambda: monitor.seen("worker-heartbeat", hostname=worker.hostname),
            timeout_s=30,
            message="a heartbeat of the worker",
        )
        quiet = run_task(events_app, "before")

        replies = ask_for_events(events_app, worker)
        assert replies == [{worker.hostname: {"ok": "task events enabled"}}], replies
        loud = run_task(events_app, "during")
        event = succeeded_event(monitor, loud)
        assert event["hostname"] == worker.hostname
        assert {"task-received", "task-started"} <= set(monitor.of_task(loud))
        # The parent sends task-succeeded when it reads the pool's reply, which can be after
        # the client saw the result; what a task sends before the monitor asks is the rest.
        assert not {"task-received", "task-started"} & set(monitor.of_task(quiet)), (
            f"a task before enable_events sent events: {monitor.of_task(quiet)}"
        )
        assert "task events on" in worker.log()

        # No renewal: off again after the lease, through Celery's own disable path.
        wait_for(
            lambda: "task events off" in worker.log(),
            timeout_s=LEASE_S + 30,
            message=lambda: f"the lease to end:\n{worker.log()[-2000:]}",
        )
        after = run_task(events_app, "after")
        ask_for_events(events_app, worker)  # on again, so a later task marks the order
        marker = run_task(events_app, "marker")
        succeeded_event(monitor, marker)
        assert not {"task-received", "task-started"} & set(monitor.of_task(after)), (
            f"a task after the lease sent events: {monitor.of_task(after)}"
        )


def test_auto_works_on_a_worker_without_heartbeats_or_gossip(
    worker_env: dict[str, str], events_app: Any, monitor: Monitor, tmp_path: Path
) -> None:
    """Celery builds such a worker's event dispatcher disabled (nothing to send at start);
    ``enable_events`` would then change nothing. In auto mode the dispatcher is live."""
    with start_worker(worker_env, tmp_path, "--without-heartbeat") as worker:
        assert ask_for_events(events_app, worker) == [
            {worker.hostname: {"ok": "task events enabled"}}
        ]
        succeeded_event(monitor, run_task(events_app, "no-heartbeat"))
        assert monitor.seen("worker-heartbeat", hostname=worker.hostname) == []


def test_off_refuses_enable_events(
    worker_env: dict[str, str], events_app: Any, tmp_path: Path
) -> None:
    with start_worker(worker_env, tmp_path, mode="off") as worker:
        replies = ask_for_events(events_app, worker)
        assert replies == [
            {worker.hostname: {"error": "task events are off here (JOBS_TASK_EVENTS=off)"}}
        ], replies
        ask_for_events(events_app, worker)
        assert worker.log().count("enable_events refused") == 1
