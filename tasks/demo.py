"""``make demo``: the reference app end to end on real services, with a readable report.

It uses ``JOBS_BROKER_URL`` if a Redis answers there, otherwise starts a private
redis-server on a free loopback port; applies the platform's migrations to the embedded
SQLite database; starts one real worker per queue with its profile; then shows

1. retries: a small workload (a flaky job, failing ones) followed through Celery's own
   events: attempts, waits and outcomes;
2. dead letters: every failed job as one row, its alert line, and a replay after the cause
   was fixed (a second replay of the same row enqueues nothing);
3. idempotent side effects: an invoice charged by a dispatch, a duplicate dispatch and a
   replay, and the payment gateway's own count of charges (one).

It stops everything it started and leaves the dead letters in ``./jobs_platform.sqlite3``
so ``celery -A tasks dlq list`` works afterwards. Exits 1 if anything went unexpectedly.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from jobs_platform.testing import RedisServer, WorkerProcess, port_answers, wait_for

ROOT = Path(__file__).resolve().parents[1]
DEMO_DIR = ROOT / ".demo"
# Wide enough for the report table even when output is piped (make, CI logs).
console = Console(highlight=False, width=max(Console().width, 140))


@dataclass
class Job:
    label: str
    task: str
    args: tuple[Any, ...]
    expected: str  # SUCCESS or FAILURE
    expected_attempts: int | None = None
    result: Any = None
    events: list[dict[str, Any]] = field(default_factory=list)


def workload() -> list[Job]:
    return [
        Job("welcome email, user 1", "tasks.email.send_welcome_email", (1,), "SUCCESS", 1),
        Job("welcome email, user 2", "tasks.email.send_welcome_email", (2,), "SUCCESS", 1),
        Job(
            "welcome email, user 0 (no such user)",
            "tasks.email.send_welcome_email",
            (0,),
            "FAILURE",
            1,
        ),
        Job("thumbnail of upload 101", "tasks.media.resize_image", (101,), "SUCCESS", 1),
        Job("thumbnail of upload 102", "tasks.media.resize_image", (102,), "SUCCESS", 1),
        Job("partner sync, account 1", "tasks.partner.sync_account", (1,), "SUCCESS", 1),
        Job("partner sync, account 2 (503 once)", "tasks.partner.sync_account", (2,), "SUCCESS", 2),
        Job("partner sync, account 3 (404)", "tasks.partner.sync_account", (3,), "FAILURE", 1),
        Job(
            "partner sync, account 4 (always 503)", "tasks.partner.sync_account", (4,), "FAILURE", 5
        ),
    ]


def redis_answers(url: str) -> bool:
    parts = urllib.parse.urlparse(url)
    if parts.scheme != "redis" or not port_answers(
        parts.hostname or "127.0.0.1", parts.port or 6379
    ):
        return False
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def broker() -> Iterator[str]:
    url = os.environ.get("JOBS_BROKER_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(url):
        console.print(f"broker: using the Redis at [bold]{url}[/]")
        yield url
        return
    with RedisServer() as server:
        console.print(
            f"broker: nothing answers at {url}; started a private redis-server at "
            f"[bold]{server.url}[/]"
        )
        yield server.url


def make_uploads(data_dir: Path) -> None:
    from tasks.media import make_pgm, upload_path

    os.environ["JOBS_APP_DATA"] = str(data_dir)
    for upload_id, (w, h) in {101: (640, 480), 102: (300, 900)}.items():
        path = upload_path(upload_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        pixels = bytes((x * 7 + y * 3) % 256 for y in range(h) for x in range(w))
        path.write_bytes(make_pgm(w, h, pixels))


class EventLog:
    """Celery task events (on by default in jobs-platform), collected per task id."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._receiver: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
            self._ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def _on_event(self, event: dict[str, Any]) -> None:
        if "uuid" in event:
            self.by_task[event["uuid"]].append(event)

    def __enter__(self) -> EventLog:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)


def summarize(job: Job) -> tuple[int, list[float], str, str]:
    started = sorted(e["timestamp"] for e in job.events if e["type"] == "task-started")
    waits = [b - a for a, b in itertools.pairwise(started)]
    state = job.result.state
    if state == "SUCCESS":
        detail = str(job.result.result)
        if ROOT.as_posix() in detail:
            detail = os.path.relpath(detail, ROOT)
    else:
        exc = job.result.result
        detail = f"{type(exc).__name__}: {exc}"
    return len(started), waits, state, detail


def report(jobs: list[Job]) -> bool:
    table = Table(title="What happened to each job", show_lines=False)
    for column in ("job", "queue", "attempts", "waits between attempts (s)", "outcome", "detail"):
        table.add_column(column, overflow="fold")
    ok = True
    for job in jobs:
        attempts, waits, state, detail = summarize(job)
        queue = (
            next((e.get("queue") for e in job.events if e.get("queue")), None)
            or job.task.split(".")[1]
        )
        as_expected = state == job.expected and (
            job.expected_attempts is None or attempts == job.expected_attempts
        )
        ok &= as_expected
        colour = "green" if state == "SUCCESS" else "red"
        table.add_row(
            job.label,
            str(queue),
            str(attempts),
            ", ".join(f"{w:.2f}" for w in waits) or "-",
            f"[{colour}]{state}[/]" + ("" if as_expected else " [bold red](unexpected)[/]"),
            detail[:90],
        )
    console.print(table)
    return ok


def section(title: str) -> None:
    console.rule(f"[bold]{title}")


def show_billing(report: dict[str, Any]) -> bool:
    table = Table(title="One invoice, charged three ways")
    table.add_column("what")
    table.add_column("result")
    table.add_row(
        "dispatch + duplicate dispatch (unique for 300 s)",
        "same task id" if report["same_task_id_on_duplicate_dispatch"] else "[red]two jobs[/]",
    )
    table.add_row(
        "replay of the finished job (a new message)",
        "skipped: status CAS saw 'paid'"
        if report["replay_result"] is None
        else str(report["replay_result"]),
    )
    table.add_row("invoice status", str(report["status"]))
    table.add_row("charges recorded by the payment gateway", str(report["gateway_charges"]))
    table.add_row("receipts sent", str(report["receipts_sent"]))
    console.print(table)
    return (
        report["gateway_charges"] == 1
        and report["receipts_sent"] == 1
        and report["status"] == "paid"
        and report["same_task_id_on_duplicate_dispatch"]
    )


def dead_letters(app: Any, jobs: list[Job], procs: list[WorkerProcess], partner: Any) -> bool:
    from tasks.demo_deadletters import show_and_replay

    failed = [j for j in jobs if j.expected == "FAILURE"]
    exhausted = next(j for j in failed if j.expected_attempts and j.expected_attempts > 1)
    return show_and_replay(
        app,
        [j.result.id for j in failed],
        replay_task_id=exhausted.result.id,
        fix=lambda: partner.heal(4),  # the partner fixed account 4: the replay succeeds
        log_paths=[p.log_path for p in procs],
        console=console,
    )


def run() -> int:
    DEMO_DIR.mkdir(exist_ok=True)
    data_dir = DEMO_DIR / "appdata"
    make_uploads(data_dir)
    from tasks.fake_partner import FakePartner

    with broker() as broker_url, FakePartner() as partner:
        env = {
            "JOBS_BROKER_URL": broker_url,
            "JOBS_PARTNER_URL": partner.url,
            "JOBS_APP_DATA": str(data_dir),
            # Demo-sized waits; production defaults are 2 s doubling up to 300 s.
            "JOBS_RETRY_BACKOFF": "0.5",
            "JOBS_RETRY_BACKOFF_MAX": "4",
        }
        os.environ.update(env)
        from jobs_platform import db
        from tasks import app, billing  # after the environment is set: the app reads it
        from tasks.gateway import GatewayServer

        database_url = app.jobs_settings.database_url
        db.upgrade(database_url)  # once, before the workers (they would race on SQLite)
        console.print(f"database: [bold]{database_url}[/] (migrated)")
        gateway = GatewayServer().start()
        env["BILLING_GATEWAY_URL"] = gateway.url
        env["JOBS_AUTO_MIGRATE"] = "0"

        procs = [
            WorkerProcess.for_profile(
                "tasks", q, env=env, cwd=str(ROOT), log_dir=str(DEMO_DIR / "logs")
            )
            for q in ("fast", "heavy", "thirdparty")
        ]
        console.print("workers: starting one per queue with its profile (logs in .demo/logs/) ...")
        with EventLog(app) as events:
            for proc in procs:
                proc.start(wait=False)
            try:
                for proc in procs:
                    proc.wait_ready(90)
                jobs = workload()
                for job in jobs:
                    job.result = app.send_task(job.task, args=job.args)
                console.print(f"enqueued {len(jobs)} jobs; waiting for each to finish ...")
                wait_for(
                    lambda: all(j.result.state in {"SUCCESS", "FAILURE"} for j in jobs),
                    timeout_s=120,
                    interval_s=0.2,
                    message="every demo job to finish",
                )
                time.sleep(0.5)  # let the last events arrive (they are informational only)
                for job in jobs:
                    job.events = events.by_task.get(job.result.id, [])

                section("1. Retries: classified, with equal-jitter backoff, through the broker")
                ok = report(jobs)
                console.print(
                    f"the partner API saw {len(partner.requests)} requests: "
                    f"{sorted(partner.requests)}; retries went back through the broker to the "
                    "same queue, permanent errors (unknown user, HTTP 404) failed at once."
                )
                section("2. Dead letters: every failed job lands once, alerts, and a replay")
                ok &= dead_letters(app, jobs, procs, partner)
                section("3. Side effects once: status CAS + the gateway's idempotency key")
                ok &= show_billing(billing.replay_demo(gateway_url=gateway.url))
            finally:
                for proc in procs:
                    proc.stop()
                gateway.stop()
    console.print(
        f"dead letters stay in {database_url}: try [bold]celery -A tasks dlq list[/] "
        "and [bold]celery -A tasks dlq stats[/]"
    )
    if not ok:
        console.print("[bold red]some jobs did not end as expected[/]")
        return 1
    console.print("[bold green]demo finished: every job ended as expected[/]")
    return 0


if __name__ == "__main__":
    sys.exit(run())
