"""How the ``dlq`` commands print: rich tables for people, JSON Lines for programs.

Rows (list, show, stats), what a replay or discard did to each row (refusals on stderr),
and what a drain pass did.

Tables never break an id, a task name, a fingerprint or a time: those columns are
``no_wrap``, and the console is made wide enough for them (wider than the terminal if it
must, so a copied line is whole). Only free text (an error message) gives way, cut with an
ellipsis on one line. Piped output is not held to 80 columns: nothing there to fit.
Cells are :class:`~rich.text.Text`, so a task name or message is never read as markup.

Whatever came from a message (task name, queue, error, traceback, raw body) goes through
:func:`~jobs_platform.cli.text.printable` before it is printed: a control sequence a
message carried shows as ``\x1b[...`` instead of acting on the operator's terminal, and
a one-line value cannot break its line (``\x0a``). ``--json`` needs nothing more: JSON
escapes control characters itself.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from jobs_platform.cli.text import printable
from jobs_platform.deadletter.store import Outcome

if TYPE_CHECKING:
    from jobs_platform.deadletter.drainer import Drained
    from jobs_platform.deadletter.spool import Spool

#: Keys of ``--json`` output (and their order).
JSON_KEYS = (
    "id",
    "task_id",
    "task_name",
    "queue",
    "args",
    "kwargs",
    "attempts",
    "errors",
    "reason",
    "status",
    "fingerprint",
    "error_type",
    "error_message",
    "priority",
    "headers",
    "worker",
    "enqueued_at",
    "failed_at",
    "redacted",
    "resolution_reason",
    "resolved_by",
    "resolved_at",
    "replayed_task_id",
    "replay_of",
    "raw_body",
    "raw_body_encoding",
    "content_type",
)
#: Keys of each ``errors`` entry in ``--json`` output; ``status`` (HTTP) only when known.
_ERROR_KEYS = ("type", "message", "at", "attempt", "status")
#: Fields ``dlq show`` prints one per line, in this order.
SHOWN_KEYS = (
    "id",
    "task_id",
    "task_name",
    "queue",
    "priority",
    "reason",
    "status",
    "attempts",
    "fingerprint",
    "worker",
    "enqueued_at",
    "failed_at",
    "replay_of",
    "replayed_task_id",
    "resolution_reason",
    "resolved_by",
    "resolved_at",
)
#: Free-text columns keep at least this many cells before the table outgrows the terminal.
FREE_TEXT_MIN = 24
_UNBOUNDED = 100_000
#: Why a row was refused, when its outcome says it all.
_WHY = {
    "missing": "no such dead letter",
    "already_resolved": "no longer dead (already replayed or discarded)",
    "not_attempted": "the replay stopped before this row",
}


def json_default(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)


def jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {key: row.get(key) for key in JSON_KEYS}
    out["errors"] = [
        {key: e.get(key) for key in _ERROR_KEYS if key in e or key != "status"}
        for e in (row.get("errors") or [])
    ]
    return out


def emit_json(objects: Iterable[dict[str, Any]]) -> None:
    """One JSON object per line on stdout."""
    for obj in objects:
        click.echo(json.dumps(obj, default=json_default))


def when(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def short_error(error_type: str | None, message: str | None, limit: int) -> str:
    return f"{(error_type or '').rsplit('.', 1)[-1]}: {(message or '')[:limit]}"


def table(
    title: str, keys: Iterable[str], free: Iterable[str] = (), *, right: Iterable[str] = ()
) -> Table:
    """A table whose ``keys`` columns never wrap and whose ``free`` columns may give way."""
    out = Table(title=title)
    for name in keys:
        out.add_column(name, no_wrap=True, justify="right" if name in right else "left")
    for name in free:
        # Wrapable for rich's layout, so these columns shrink first; each cell is a
        # one-line Text cut with an ellipsis, or wraps (see cells()).
        out.add_column(name, no_wrap=False)
    return out


def cells(values: Iterable[object], *, cut: bool = True) -> list[Text]:
    """Row cells as plain, printable Text; with ``cut`` a cell stays on one line (ellipsis)."""
    return [
        Text(
            printable(str(v), multiline=not cut),
            no_wrap=cut,
            overflow="ellipsis" if cut else "fold",
        )
        for v in values
    ]


def _width(console: Console, renderable: Table) -> int:
    return Measurement.get(console, console.options.update_width(_UNBOUNDED), renderable).maximum


def print_table(console: Console, renderable: Table) -> None:
    """Print ``renderable`` at a width that never breaks its ``no_wrap`` columns."""
    natural = _width(console, renderable)
    width = console.width
    if not console.is_terminal:
        width = natural
    elif natural > width:
        free = [c for c in renderable.columns if not c.no_wrap]
        for column in free:
            column.max_width = FREE_TEXT_MIN
        width = max(width, _width(console, renderable))
        for column in free:
            column.max_width = None  # rich shrinks them to the width chosen
    console.width = width
    console.print(renderable)


def dead_letters(console: Console, rows: list[dict[str, Any]], title: str) -> None:
    keys = ("id", "failed (UTC)", "task", "queue", "reason", "tries", "status", "fingerprint")
    out = table(title, keys, ("error",))
    for r in rows:
        out.add_row(
            *cells(
                (
                    r["id"],
                    when(r["failed_at"]),
                    r["task_name"] or "?",
                    r["queue"],
                    r["reason"],
                    r["attempts"],
                    r["status"],
                    r["fingerprint"],
                    short_error(r["error_type"], r["error_message"], 80),
                )
            )
        )
    print_table(console, out)


def stats(console: Console, result: Any, status: str) -> None:
    console.print(Text(f"{result.total} dead letter(s) with status {status}"))
    by_task = table("By task", ("task", "count"), right=("count",))
    for item in result.by_task:
        by_task.add_row(*cells((item["task_name"] or "?", item["count"])))
    print_table(console, by_task)
    groups = table(
        "By fingerprint",
        ("fingerprint", "task", "count", "last failed"),
        ("error",),
        right=("count",),
    )
    for g in result.by_fingerprint:
        groups.add_row(
            *cells(
                (
                    g["fingerprint"],
                    g["task_name"] or "?",
                    g["count"],
                    when(g["last_failed_at"]),
                    short_error(g["error_type"], g["error_message"], 60),
                )
            )
        )
    print_table(console, groups)


def _line(console: Console, key: str, value: str) -> None:
    # soft_wrap: a long task name or body stays one line, whatever the width.
    line = Text.assemble((printable(key, multiline=False), "bold"), ": ")
    line.append(printable(value, multiline=False))
    console.print(line, soft_wrap=True)


def show(console: Console, row: dict[str, Any]) -> None:
    """One dead letter: its fields, payload, errors in order and traceback."""
    for key in SHOWN_KEYS:
        value = row[key]
        if value is not None and value != "":
            _line(console, key, str(value))
    _line(console, "args", json.dumps(row["args"]))
    _line(console, "kwargs", json.dumps(row["kwargs"]))
    stored = row.get("headers")
    headers: dict[str, Any] = stored if isinstance(stored, dict) else {}
    for key, label in (("jobs_checkpoint", "checkpoint"), ("jobs_canvas", "canvas")):
        if headers.get(key) is not None:
            _line(console, label, json.dumps(headers[key]))
    if row["redacted"]:
        console.print(Text("secrets were redacted from this payload", "yellow"))
    if row["raw_body"] is not None:
        _line(
            console,
            f"raw body ({row['content_type']}, {row['raw_body_encoding']})",
            row["raw_body"][:2000],
        )
    errors = table("Errors, in order", ("#", "at (UTC)", "type"), ("message",))
    for e in row["errors"] or []:
        # The whole message: this is the detail view, so it wraps rather than being cut.
        errors.add_row(
            *cells((e.get("attempt"), e.get("at"), e.get("type"))),
            *cells((e.get("message"),), cut=False),
        )
    print_table(console, errors)
    if row["traceback"]:
        console.print(Text("traceback", "bold"))
        click.echo(printable(row["traceback"]))


# -- what a bulk operation did ----------------------------------------------------------


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """``{"id", "outcome"}``, plus ``why``, the new ``task_id`` or what a dry run would send."""
    out: dict[str, Any] = {"id": outcome.id, "outcome": outcome.outcome}
    if outcome.why is not None:
        out["why"] = outcome.why
    if outcome.task_id is not None:
        out["task_id"] = outcome.task_id
    out.update(outcome.would_send or {})
    return out


def refusals(outcomes: Iterable[Outcome]) -> None:
    """One line per refused row, on stderr."""
    for item in outcomes:
        if not item.done:
            why = item.why or _WHY.get(item.outcome, "")
            click.echo(printable(f"{item.id}: {item.outcome}: {why}", multiline=False), err=True)


def replayed(outcomes: Sequence[Outcome], *, dry_run: bool) -> None:
    """A line per row replayed (stdout), per row refused (stderr), then the count."""
    for item in outcomes:
        if item.done:
            click.echo(f"{item.id}: {item.outcome} {item.task_id or ''}".rstrip())
    refusals(outcomes)
    done = sum(item.done for item in outcomes)
    what = "replay (dry run)" if dry_run else "replay"
    would = "would be " if dry_run else ""
    click.echo(f"{what}: {done} of {len(outcomes)} {would}replayed")


def drained(done: Drained, spool: Spool) -> None:
    """What one drain pass did, counted by the pass itself."""
    click.echo(
        f"moved {done.moved} spooled dead letter(s) into the table; "
        f"{done.left} left in the spool {spool.key!r}"
    )
    if done.rejected:
        click.echo(
            f"{done.rejected} refused by the database for good, moved to "
            f"{spool.rejected_key} (see the log lines jobs.dlq.rejected)",
            err=True,
        )
    if done.unreadable:
        click.echo(
            f"{done.unreadable} not dead letters at all, moved to {spool.unreadable_key} "
            "(see the log lines jobs.dlq.unreadable)",
            err=True,
        )
