"""The tour's import step: a big CSV import as a batch of chunks that checkpoint.

A file of orders (100,000 rows; the short form 5,000) with one malformed amount goes in
through :func:`tasks.imports.start_import`: a batch of 500-row chunks on ``heavy``. The
chunk holding the poison row is dead-lettered alone, with its checkpoint; every chunk
settled, ``on_complete`` updates the dashboard. Then the row is fixed in the file and that
one dead letter replayed (``jobs_platform.deadletter.replay``, what ``celery -A tasks dlq
replay`` calls): the chunk resumes from its checkpoint, the batch succeeds, and
``on_success`` reindexes search. :func:`run` does it during the tour (with a progress line
as chunks settle), :func:`settle` reads what it came to after the drain (so a callback run
twice would be seen), :func:`report` prints the section and its expectations.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections import Counter
from typing import Any

import sqlalchemy as sa
from rich.table import Table

from jobs_platform.batches import state as batch_state
from jobs_platform.deadletter import replay as replaying
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import wait_for
from tasks import billing, imports
from tasks.jobs import app

#: Rows of the file, and the one whose amount is written "19,90".
ROWS = {"full": 100_000, "short": 5_000}
MALFORMED_ROW = {"full": 48_345, "short": 2_345}
FIXED_AMOUNT = "19.90"
#: A progress line at most this often (and when the batch settles).
PROGRESS_EVERY_S = 1.0


@dataclasses.dataclass
class Counts:
    """A batch's counters at one moment (from ``jobs_platform.batches.state``)."""

    status: str
    total: int
    pending: int
    succeeded: int
    dead: int
    cancelled: int

    @classmethod
    def of(cls, state: batch_state.BatchState) -> Counts:
        return cls(
            state.status, state.total, state.pending, state.succeeded, state.dead, state.cancelled
        )

    def line(self) -> str:
        return (
            f"{self.total} members: {self.succeeded} succeeded, {self.dead} dead, "
            f"{self.cancelled} cancelled, {self.pending} pending (status {self.status})"
        )


@dataclasses.dataclass
class Import:
    filename: str
    rows: int
    malformed_row: int
    batch_id: str
    chunks: int
    started: float
    #: When the step began (before the file was written) and ended, for its own duration.
    began: float = 0.0
    ended: float = 0.0
    #: Seconds from the batch's creation until every chunk had settled, and until it succeeded.
    settled_after_s: float = 0.0
    succeeded_after_s: float = 0.0
    #: The counters when every chunk had settled the first time (before the replay).
    at_settle: Counts | None = None
    #: The dead chunk: its first task id, its letter, what the letter says.
    dead_task_id: str = ""
    dead_range: tuple[int, int] = (0, 0)
    dead_letter_id: int | None = None
    dead_reason: str = ""
    dead_error: str = ""
    checkpoint: Any = None
    #: The replay: its task id and what the replayed chunk returned.
    replay_task_id: str = ""
    replayed: dict[str, Any] = dataclasses.field(default_factory=dict)
    letter_after: str = ""
    #: Read by :func:`settle`, after the tour drained every job.
    final: Counts | None = None
    #: Callback name -> runs for this batch (from imports/callbacks.log), and the rows each saw.
    runs: Counter[str] = dataclasses.field(default_factory=Counter)
    rows_seen: dict[str, int] = dataclasses.field(default_factory=dict)
    rows_imported: int = 0

    def expected_deaths(self) -> set[str]:
        """The poison chunk's task id, if it is the chunk that died (the tour's other
        expectations leave it aside: its death is this step's point)."""
        lo, hi = self.dead_range
        return {self.dead_task_id} if self.dead_task_id and lo <= self.malformed_row < hi else set()


def _state(batch_id: str) -> batch_state.BatchState:
    found = batch_state.get(app, batch_id)
    if found is None:
        raise RuntimeError(f"batch {batch_id} is not in the database")
    return found


def _settled(count: Counts) -> int:
    return count.succeeded + count.dead + count.cancelled


def run(workload: str, view: Any) -> Import:
    """Import the file; replay its dead chunk once the batch has settled; wait until the
    batch has succeeded."""
    began = time.time()
    rows, malformed = ROWS[workload], MALFORMED_ROW[workload]
    engine = billing.billing_engine()
    imports.create_schema(engine)
    filename = f"orders-{int(time.time())}.csv"
    # Earlier tours' files and rows: a demo database keeps only the last import.
    for old in imports.imports_dir().glob("orders-*"):
        old.unlink(missing_ok=True)
    with engine.begin() as conn:
        conn.execute(sa.delete(imports.import_rows))
    imports.callbacks_log().unlink(missing_ok=True)
    imports.write_file(filename, rows, malformed=malformed)
    started = time.time()
    made = imports.start_import(filename)
    step = Import(filename, rows, malformed, made.id, len(made.results), started, began)
    view.say(
        f"import: {filename}, {rows:,} rows, one amount written '19,90' (row {malformed:,}): "
        f"batch {made.id[:8]} of {step.chunks} chunks of {imports.CHUNK_ROWS} rows on heavy"
    )
    said = {"at": 0.0, "settled": -1}

    def progress(state: batch_state.BatchState) -> Counts:
        count = Counts.of(state)
        settled, now = _settled(count), time.time()
        view.progress = f"import: {settled}/{count.total} chunks settled"
        if settled != said["settled"] and (
            now - said["at"] >= PROGRESS_EVERY_S or not count.pending
        ):
            said.update(at=now, settled=settled)
            view.say(
                f"import: {settled:>{len(str(count.total))}}/{count.total} chunks settled "
                f"({count.succeeded} succeeded, {count.dead} dead)"
            )
        return count

    def settled() -> batch_state.BatchState | None:
        view.tick()
        state = _state(made.id)
        progress(state)
        return state if state.completed_at is not None else None

    state = wait_for(settled, timeout_s=300, interval_s=0.2, message="the import's batch to settle")
    step.settled_after_s = time.time() - started
    step.at_settle = Counts.of(state)
    if state.dead_letters:
        dead_letter(step, state, view)
    if step.dead_letter_id is not None:
        replay(step, view)

    def succeeded() -> batch_state.BatchState | None:
        view.tick()
        state = _state(made.id)
        progress(state)
        return state if state.succeeded_at is not None else None

    if step.replay_task_id:
        wait_for(succeeded, timeout_s=120, interval_s=0.2, message="the import to succeed")
        step.succeeded_after_s = time.time() - started
        result = app.AsyncResult(step.replay_task_id)
        wait_for(result.ready, timeout_s=60, interval_s=0.1, message="the replayed chunk")
        if isinstance(result.result, dict):
            step.replayed = dict(result.result)
        view.say(
            f"import: the replayed chunk resumed at row {_number(step.replayed.get('resumed_at'))} "
            f"and wrote {_number(step.replayed.get('rows'))} rows; the batch succeeded "
            f"{step.succeeded_after_s:.1f} s after it was sent"
        )
    view.progress = ""
    step.ended = time.time()
    view.say(f"import: the step took {step.ended - step.began:.1f} s")
    return step


def _number(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "?"


def dead_letter(step: Import, state: batch_state.BatchState, view: Any) -> None:
    """What the dead chunk's letter says: the poison row's chunk (the first one, if only
    others died; the report then says so)."""
    store = DeadLetterStore(app.jobs_settings.database_url)
    letters = [
        (member_id, store.get(letter_id) if letter_id is not None else None)
        for member_id, letter_id in state.dead_letters.items()
    ]

    def holds_poison(row: dict[str, Any] | None) -> bool:
        return row is not None and int(row["args"][1]) <= step.malformed_row < int(row["args"][2])

    member_id, row = next(((m, r) for m, r in letters if holds_poison(r)), letters[0])
    step.dead_task_id = member_id
    if row is None:
        return
    step.dead_letter_id = int(row["id"])
    start, stop = int(row["args"][1]), int(row["args"][2])
    step.dead_range = (start, stop)
    step.dead_reason = str(row["reason"])
    message = str(row["error_message"]).removeprefix(f"{step.filename} ")
    step.dead_error = f"{str(row['error_type']).rsplit('.', 1)[-1]}: {message}"
    step.checkpoint = (row.get("headers") or {}).get("jobs_checkpoint")
    view.say(
        f"import: chunk {start:,}-{stop - 1:,} dead-lettered alone (#{step.dead_letter_id}, "
        f"{step.dead_reason}, checkpoint {json.dumps(step.checkpoint)}); every chunk "
        f"settled after {step.settled_after_s:.1f} s: on_complete is due"
    )


def replay(step: Import, view: Any) -> None:
    """Fix the row in the file, then replay the one dead letter."""
    assert step.dead_letter_id is not None
    imports.fix_amount(step.filename, step.malformed_row, FIXED_AMOUNT)
    store = DeadLetterStore(app.jobs_settings.database_url)
    new_id = replaying.replay(
        app,
        store,
        step.dead_letter_id,
        reason=f"row {step.malformed_row} fixed: amount {FIXED_AMOUNT}",
        actor="make demo",
    )
    step.replay_task_id = new_id or ""
    view.say(
        f"import: row {step.malformed_row:,} fixed in the file ('19,90' -> '{FIXED_AMOUNT}'); "
        f"dead letter #{step.dead_letter_id} replayed as task {step.replay_task_id[:8]}"
    )


def settle(step: Import | None) -> None:
    """What the import came to, after the tour drained every job."""
    if step is None:
        return
    step.final = Counts.of(_state(step.batch_id))
    log = imports.callbacks_log()
    for line in log.read_text().splitlines() if log.exists() else []:
        run = json.loads(line)
        if run.get("batch") == step.batch_id:
            step.runs[run["callback"]] += 1
            step.rows_seen[run["callback"]] = int(run["rows"])
    step.rows_imported = imports.imported(billing.billing_engine(), step.filename)[0]
    if step.dead_letter_id is not None:
        row = DeadLetterStore(app.jobs_settings.database_url).get(step.dead_letter_id) or {}
        step.letter_after = str(row.get("status", "missing"))


def title(step: Import | None, workload: str) -> str:
    rows = step.rows if step is not None else ROWS[workload]
    return f"8c. A {rows:,}-row CSV import as a batch of {imports.CHUNK_ROWS}-row chunks"


def _checkpoint_row(checkpoint: Any) -> int | None:
    row = checkpoint.get("row") if isinstance(checkpoint, dict) else None
    return row if isinstance(row, int) else None


def report(rep: Any) -> None:
    """Section 8c of the report, with its four expectations."""
    facts = rep.facts
    step: Import | None = facts.csv_import
    rep.console.print()
    rep.console.rule(f"[bold]{title(step, facts.workload.name)}")
    if step is None:
        rep.expect("the import's malformed row dead-lettered its chunk alone", False, "no import")
        return
    first, final = step.at_settle, step.final
    lo, hi = step.dead_range
    at = _checkpoint_row(step.checkpoint)
    dashboard, reindex = step.runs["update_dashboard"], step.runs["reindex_search"]
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("seen")
    table.add_row(
        "the batch",
        f"[bold]{step.batch_id}[/] ({step.chunks} chunks of {imports.CHUNK_ROWS} rows of "
        f"{step.filename}, on heavy)",
    )
    table.add_row(
        "every chunk settled",
        f"{step.settled_after_s:.1f} s after the batch was sent: {first.line() if first else '?'}",
    )
    if step.dead_letter_id is not None:
        table.add_row(
            "  the dead chunk",
            f"rows {lo:,}-{hi - 1:,}: dead letter [bold]#{step.dead_letter_id}[/], "
            f"{step.dead_reason}, {step.dead_error}",
        )
        table.add_row(
            "  its checkpoint (in the letter)",
            f"{json.dumps(step.checkpoint)}: rows {lo:,}-{(at or lo) - 1:,} were in",
        )
        table.add_row(
            "the replay",
            f"row {step.malformed_row:,} fixed in the file; #{step.dead_letter_id} replayed "
            f"as {step.replay_task_id[:8]}: resumed at row "
            f"{_number(step.replayed.get('resumed_at'))}, wrote "
            f"{_number(step.replayed.get('rows'))} rows; the letter is now {step.letter_after}",
        )
    table.add_row(
        "after the replay",
        f"{step.succeeded_after_s:.1f} s after the batch was sent: "
        + (final.line() if final else "?"),
    )
    seen = step.rows_seen.get("update_dashboard", 0)
    table.add_row(
        "on_complete: update_dashboard",
        f"[bold]{dashboard}[/] run(s), when every chunk had settled: it saw {seen:,} rows"
        + (f" ({step.rows - seen:,} of the dead chunk's not in yet)" if seen < step.rows else ""),
    )
    table.add_row(
        "on_success: reindex_search",
        f"[bold]{reindex}[/] run(s), when every chunk had succeeded: it saw "
        f"{step.rows_seen.get('reindex_search', 0):,} rows",
    )
    table.add_row(
        "rows imported",
        f"[bold]{step.rows_imported:,}[/] of the file's {step.rows:,}",
    )
    rep.console.print(table)
    rep.console.print(
        "One job per 500 rows, each writing 100 rows per transaction and checkpointing after "
        "each (self.checkpoint), as one batch: the bad row killed its own chunk at once (a "
        "PermanentError, no retries) and no other; the replay of that one letter started at "
        "its checkpoint, not at row one. The batch counted each chunk once and called each "
        "callback once, through the outbox (docs/batches.md, docs/checkpoints.md)."
    )
    rep.console.print(
        f"To look again: [bold]celery -A tasks batch show {step.batch_id}[/]"
        + (
            f", [bold]celery -A tasks dlq show {step.dead_letter_id}[/]"
            if step.dead_letter_id
            else ""
        )
    )
    expected_at = step.malformed_row // imports.CHECKPOINT_EVERY * imports.CHECKPOINT_EVERY
    rep.expect(
        "the import's malformed row dead-lettered its chunk alone, with its checkpoint",
        first is not None
        and first.dead == 1
        and first.succeeded == first.total - 1
        and lo <= step.malformed_row < hi
        and step.dead_reason == "permanent"
        and at == expected_at,
        f"{first.dead if first else '?'} of {step.chunks} chunks dead (rows {lo:,}-{hi - 1:,}), "
        f"{step.dead_reason or 'no letter'}, checkpoint row {at if at is None else f'{at:,}'}",
    )
    resumed = step.replayed.get("resumed_at")
    rep.expect(
        "the replayed chunk resumed at its checkpoint and the batch succeeded",
        resumed is not None
        and resumed == at
        and final is not None
        and final.status == "succeeded"
        and final.succeeded == final.total == step.chunks,
        f"resumed at row {resumed if resumed is None else f'{resumed:,}'}; "
        + (final.line() if final else "?"),
    )
    rep.expect(
        "the import's on_complete and on_success ran once each",
        dashboard == 1 and reindex == 1,
        f"update_dashboard {dashboard}, reindex_search {reindex}",
    )
    rep.expect(
        "rows imported = rows in the file",
        step.rows_imported == step.rows == step.rows_seen.get("reindex_search"),
        f"{step.rows_imported:,} imported of {step.rows:,}; the reindex saw "
        f"{step.rows_seen.get('reindex_search', 0):,}",
    )
