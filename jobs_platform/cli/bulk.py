"""Replay and discard: which rows, what happened to each, and the exit code that says so.

Every refusal exits non-zero, also in bulk: a refused row (missing, no longer dead,
redacted, not replayable, its queue not declared) does not stop the others; at the end
the command says on stderr how many were refused and exits :data:`REFUSED`. A broker that
(or result store, or database) that fails ends a replay early: the row it failed on stays
dead, and each row not attempted says so.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import click
from celery.exceptions import QueueNotFound
from rich.console import Console
from rich.progress import Progress

from jobs_platform.cli.options import unfiltered
from jobs_platform.deadletter.replay import ReplayRefused, check_replayable
from jobs_platform.deadletter.store import DeadLetterStore, Filter

#: Exit code when a row was refused, or the command could not run (``ClickException``).
REFUSED = 1
#: Outcomes that did (or, in a dry run, would do) what was asked.
DONE = frozenset({"replayed", "would_replay"})
BATCH = 500
_WHY = {
    "missing": "no such dead letter",
    "already_resolved": "no longer dead (already replayed or discarded)",
    "not_attempted": "the replay stopped before this row",
}


def progress(total: int, *, shown_from: int) -> Progress:
    """A progress bar on stderr for bulk operations (stdout stays clean for ``--json``)."""
    return Progress(console=Console(stderr=True), transient=True, disable=total < shown_from)


def check_selection(ids: tuple[int, ...], where: Filter) -> None:
    """IDs or a filter, exactly one of them (before anything is opened)."""
    if ids and not unfiltered(where):
        raise click.UsageError("give dead-letter IDs or a filter (--task, ...), not both")
    if not ids and unfiltered(where):
        raise click.UsageError("give dead-letter IDs or a filter (--task, --fingerprint, ...)")


def selected(store: DeadLetterStore, ids: tuple[int, ...], where: Filter) -> list[int]:
    """Ids given (once each), or those matching the filter (only ``dead`` rows)."""
    if ids:
        return list(dict.fromkeys(ids))
    return [i for batch in store.ids(where) for i in batch]


def replay_rows(
    store: DeadLetterStore, ids: list[int], *, rate: float, **options: Any
) -> list[dict[str, Any]]:
    """One outcome per id, in order (``options``: see :func:`replay_one`)."""
    results: list[dict[str, Any]] = []
    with progress(len(ids), shown_from=2) as bar:
        task = bar.add_task("replaying", total=len(ids))
        for row_id in ids:
            try:
                results.append(replay_one(store, row_id, **options))
            except Exception as exc:
                # The broker, result store or database failed (the row stays dead: its
                # publish is inside its transaction); the next rows would fail alike.
                why = f"{type(exc).__name__}: {exc}".strip()
                results.append({"id": row_id, "outcome": "failed", "why": why})
                results += [{"id": i, "outcome": "not_attempted"} for i in ids[len(results) :]]
                break
            bar.advance(task)
            if results[-1]["outcome"] == "replayed":
                time.sleep(1.0 / rate)  # throttle: a replay storm must not flood the queue
    return results


def replay_one(
    store: DeadLetterStore,
    row_id: int,
    *,
    reason: str,
    actor: str,
    dry_run: bool,
    allow_redacted: bool,
    publish: Any,
) -> dict[str, Any]:
    row = store.get(row_id)
    if row is None:
        return {"id": row_id, "outcome": "missing"}
    if row["status"] != "dead":
        return {"id": row_id, "outcome": "already_resolved"}
    try:
        check_replayable(row, allow_redacted=allow_redacted)
    except ReplayRefused as exc:
        return {"id": row_id, "outcome": "refused", "why": str(exc)}
    if dry_run:
        return {
            "id": row_id,
            "outcome": "would_replay",
            "task_name": row["task_name"],
            "queue": row["queue"],
            "args": row["args"],
            "kwargs": row["kwargs"],
        }
    try:
        new_id = store.replay(row_id, reason=reason, actor=actor, publish=publish)
    except QueueNotFound as exc:
        # The row stays dead (the publish is inside the row's transaction).
        why = f"its queue is not declared in this app: {exc}"
        return {"id": row_id, "outcome": "refused", "why": why}
    if new_id is None:
        return {"id": row_id, "outcome": "already_resolved"}
    return {"id": row_id, "outcome": "replayed", "task_id": new_id}


def discard_rows(store: DeadLetterStore, ids: list[int], *, reason: str, actor: str) -> int:
    """Discard the still-dead rows among ``ids``, in batches; how many moved."""
    moved = 0
    with progress(len(ids), shown_from=BATCH) as bar:
        task = bar.add_task("discarding", total=len(ids))
        for start in range(0, len(ids), BATCH):
            chunk = ids[start : start + BATCH]
            moved += store.discard(chunk, reason=reason, actor=actor)
            bar.advance(task, len(chunk))
    return moved


def not_dead(store: DeadLetterStore, ids: list[int]) -> list[dict[str, Any]]:
    """Refusals for the ``ids`` that do not exist or are no longer ``dead``."""
    refusals = []
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        found = store.listing(Filter(ids=tuple(chunk)), page_size=len(chunk))
        status = {row["id"]: row["status"] for row in found}
        for row_id in chunk:
            if row_id not in status:
                refusals.append({"id": row_id, "outcome": "missing"})
            elif status[row_id] != "dead":
                refusals.append({"id": row_id, "outcome": "already_resolved"})
    return refusals


def refused(item: dict[str, Any]) -> bool:
    return item["outcome"] not in DONE


def explain(refusals: Iterable[dict[str, Any]]) -> None:
    """One line per refused row, on stderr."""
    for item in refusals:
        why = item.get("why") or _WHY.get(item["outcome"], "")
        click.echo(f"{item['id']}: {item['outcome']}: {why}", err=True)


def conclude(ctx: click.Context, what: str, total: int, refused_count: int) -> None:
    """Exit :data:`REFUSED` after saying how many rows were refused, if any were."""
    if refused_count:
        click.echo(f"{what}: {refused_count} of {total} refused", err=True)
        ctx.exit(REFUSED)
