"""The dead-letter part of ``make demo``: show the rows, the alert lines, and one replay.

Call :func:`show_and_replay` from the demo while its workers still run (the replay needs a
worker to execute it). It leaves every row in the database, so ``celery -A tasks dlq list``
works after the demo.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from jobs_platform import db
from jobs_platform.deadletter import replay as replaying
from jobs_platform.deadletter.alerts import EVENT
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import wait_for


def show_and_replay(
    app: Any,
    failed_task_ids: Sequence[str],
    *,
    replay_task_id: str | None = None,
    fix: Callable[[], None] | None = None,
    log_paths: Sequence[str | Path] = (),
    console: Console | None = None,
    timeout_s: float = 60.0,
) -> bool:
    """Print the dead letters of ``failed_task_ids``, their alert lines, and replay one.

    ``replay_task_id`` picks the job to replay (one of ``failed_task_ids``); ``fix`` is
    called first to "fix the cause" (without it the replay dies again, and the demo shows
    the lineage of the new row instead). Returns whether every step went as expected.
    """
    console = console or Console(highlight=False)
    settings = app.jobs_settings
    if settings.auto_migrate:
        db.upgrade(settings.database_url)
    store = DeadLetterStore(settings.database_url)
    rows = wait_for(
        lambda: (
            [r[0] for r in map(store.by_task_id, failed_task_ids) if r]
            if all(store.by_task_id(t) for t in failed_task_ids)
            else None
        ),
        timeout_s=timeout_s,
        message="a dead letter per failed job",
    )
    table = Table(title=f"Dead letters ({settings.database_url})")
    for name in ("id", "task", "queue", "reason", "attempts", "errors (in order)", "fingerprint"):
        table.add_column(name, overflow="fold")
    for r in rows:
        errors = " → ".join(str(e.get("type", "")).rsplit(".", 1)[-1] for e in r["errors"])
        table.add_row(
            str(r["id"]),
            r["task_name"],
            r["queue"],
            r["reason"],
            str(r["attempts"]),
            errors,
            r["fingerprint"],
        )
    console.print(table)

    alerts = [
        line
        for path in log_paths
        for line in Path(path).read_text(errors="replace").splitlines()
        if EVENT in line and any(t in line for t in failed_task_ids)
    ]
    console.print(f"alert lines ({len(alerts)}, one per dead letter, event {EVENT!r}):")
    for line in alerts:
        console.print(f"  {line}", markup=False)

    ok = len(alerts) == len(rows) or not log_paths
    if replay_task_id is not None:
        ok = _replay(app, store, replay_task_id, fix, console, timeout_s) and ok
    console.print(
        "the rows stay in the database: try [bold]celery -A tasks dlq list[/], "
        "[bold]dlq show ID[/], [bold]dlq stats[/], "
        "[bold]dlq replay ID --reason '...' --dry-run[/]"
    )
    return ok


def _replay(
    app: Any,
    store: DeadLetterStore,
    task_id: str,
    fix: Callable[[], None] | None,
    console: Console,
    timeout_s: float,
) -> bool:
    [row] = store.by_task_id(task_id)[:1]
    if fix is not None:
        fix()
        console.print("the cause was fixed; replaying with the original arguments ...")
    new_id = replaying.replay(app, store, row["id"], reason="demo: cause fixed", actor="make demo")
    if new_id is None:
        console.print(f"dead letter {row['id']} was already replayed")
        return False
    again = replaying.replay(app, store, row["id"], reason="demo: twice", actor="make demo")
    console.print(
        f"replayed dead letter {row['id']} as task {new_id} "
        f"(a second replay of the same row enqueued {'nothing' if again is None else again})"
    )
    result = app.AsyncResult(new_id)
    state = wait_for(
        lambda: result.state if result.state in {"SUCCESS", "FAILURE"} else None,
        timeout_s=timeout_s,
        message=f"replayed task {new_id}",
    )
    parent = store.get(row["id"]) or {}
    console.print(
        f"replay ended {state}; row {row['id']} is now {parent.get('status')} "
        f"-> {parent.get('replayed_task_id')}"
    )
    if state == "FAILURE":
        [child] = wait_for(
            lambda: store.by_task_id(new_id),
            timeout_s=timeout_s,
            message="the replay's dead letter",
        )
        console.print(
            f"it died again: dead letter {child['id']} has replay_of={child['replay_of']}"
        )
    return again is None
