"""Replay and discard: which rows, progress, and the exit code that says what happened.

Every refusal exits non-zero, also in bulk: a refused row (missing, no longer dead,
redacted, not replayable, its queue not declared) does not stop the others; at the end
the command says on stderr how many were refused and exits :data:`REFUSED`. A broker (or
result store, or database) that fails ends a replay early: the row it failed on stays
dead, and each row not attempted says so (see :func:`.replay.replay_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import click
from rich.console import Console
from rich.progress import Progress

from jobs_platform.cli.options import unfiltered
from jobs_platform.deadletter.store import DeadLetterStore, Filter, Outcome

T = TypeVar("T")

#: Exit code when a row was refused, or the command could not run (``ClickException``).
REFUSED = 1
BATCH = 500


def progress(total: int, *, shown_from: int) -> Progress:
    """A progress bar on stderr for bulk operations (stdout stays clean for ``--json``)."""
    return Progress(console=Console(stderr=True), transient=True, disable=total < shown_from)


def with_progress(items: Iterable[T], total: int, description: str) -> Iterator[T]:
    """``items``, advancing a progress bar (shown from two rows on) as each one arrives."""
    with progress(total, shown_from=2) as bar:
        task = bar.add_task(description, total=total)
        for item in items:
            yield item
            bar.advance(task)


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


def not_dead(store: DeadLetterStore, ids: list[int]) -> list[Outcome]:
    """Refusals for the ``ids`` that do not exist or are no longer ``dead``."""
    refusals = []
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        found = store.listing(Filter(ids=tuple(chunk)), page_size=len(chunk))
        status = {row["id"]: row["status"] for row in found}
        for row_id in chunk:
            if row_id not in status:
                refusals.append(Outcome(row_id, "missing"))
            elif status[row_id] != "dead":
                refusals.append(Outcome(row_id, "already_resolved"))
    return refusals


def conclude(ctx: click.Context, what: str, total: int, refused_count: int) -> None:
    """Exit :data:`REFUSED` after saying how many rows were refused, if any were."""
    if refused_count:
        click.echo(f"{what}: {refused_count} of {total} refused", err=True)
        ctx.exit(REFUSED)
