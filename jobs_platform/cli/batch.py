"""``celery -A APP batch list|show ID|cancel ID``: batches as they stand.

``list`` prints the newest batches (``--status`` filters: running, succeeded, failed,
cancelled); ``show ID`` one batch, with the dead letter of each dead member (``--watch``:
a progress bar until it settles); ``cancel ID --reason TEXT`` stops members not started yet
(they are counted cancelled; running ones finish; on_complete still fires once).
``--json`` prints JSON Lines on stdout (``show``: one object). Exit codes: 0 done, 1 no
such batch or the database did not answer (one line on stderr), 2 usage error (an id or a
reason no database can hold: NUL, bytes that are not UTF-8, as the ``dlq`` commands refuse).
The name and the cancel reason are printed escaped (:func:`~jobs_platform.cli.text.printable`).
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from jobs_platform.batches import create, state
from jobs_platform.cli import render
from jobs_platform.cli.options import json_option
from jobs_platform.cli.text import check_text, printable


@click.group()
def batch() -> None:
    """Batches: list, show (--watch), cancel."""


def _failed(doing: str, exc: Exception) -> click.ClickException:
    """One line: a database error's text carries the SQL and a link on lines of their own."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return click.ClickException(f"{doing}: {first}")


def _reason(ctx: click.Context, param: click.Parameter, value: str) -> str:
    text = str(check_text(ctx, param, value)).strip()
    if not text:
        raise click.BadParameter("give a reason: it is stored with the batch", ctx, param)
    return text


batch_id_argument = click.argument("batch_id", callback=check_text)


def _get(ctx: click.Context, batch_id: str) -> state.BatchState:
    try:
        found = state.get(ctx.obj.app, batch_id)
    except Exception as exc:
        raise _failed("cannot read the batches", exc) from exc
    if found is None:
        click.echo(f"no batch {printable(batch_id, multiline=False)!r}", err=True)
        ctx.exit(1)
    assert found is not None
    return found


@batch.command("list")
@click.option("--status", type=click.Choice(state.STATUSES), default=None)
@click.option("--limit", type=click.IntRange(1), default=50, show_default=True)
@json_option
@click.pass_context
def list_(ctx: click.Context, status: str | None, limit: int, as_json: bool) -> None:
    """The newest batches first."""
    try:
        rows = state.listing(ctx.obj.app, status=status, limit=limit)
    except Exception as exc:
        raise _failed("cannot read the batches", exc) from exc
    if as_json:
        render.emit_json(row.as_dict() for row in rows)
        return
    keys = ("id", "name", "status", "total", "pending", "succeeded", "dead", "cancelled")
    table = render.table(
        "batches", keys, right=("total", "pending", "succeeded", "dead", "cancelled")
    )
    for row in rows:
        table.add_row(*render.cells(getattr(row, key) for key in keys))
    render.print_table(Console(), table)


@batch.command("show")
@batch_id_argument
@json_option
@click.option("--watch", is_flag=True, help="A progress bar until the batch settles.")
@click.option("--interval", type=float, default=1.0, show_default=True, help="--watch's poll (s).")
@click.pass_context
def show(ctx: click.Context, batch_id: str, as_json: bool, watch: bool, interval: float) -> None:
    """One batch: counts, status, callbacks, and the dead letter of each dead member."""
    found = _get(ctx, batch_id)
    if watch:
        found = _watch(ctx, found, interval)
    if as_json:
        render.emit_json([found.as_dict()])
        return
    echo = click.echo
    echo(f"batch {found.id} ({printable(found.name, multiline=False)}): {found.status}")
    echo(
        f"  {found.total} members: {found.pending} pending, {found.succeeded} succeeded, "
        f"{found.dead} dead, {found.cancelled} cancelled"
    )
    echo(f"  created {render.when(found.created_at)}")
    for label, value in (
        ("completed", found.completed_at),
        ("succeeded", found.succeeded_at),
        ("first death", found.failed_at),
        ("cancelled", found.cancelled_at),
    ):
        if value is not None:
            echo(f"  {label} {render.when(value)}")
    if found.cancel_reason:
        echo(f"  cancel reason: {printable(found.cancel_reason, multiline=False)}")
    echo(f"  callbacks: {', '.join(found.callbacks) or 'none'}")
    for member, letter in found.dead_letters.items():
        shown = f"dead letter {letter} (celery -A APP dlq show {letter})" if letter else "?"
        echo(f"  dead member {printable(member, multiline=False)}: {shown}")


def _watch(ctx: click.Context, found: state.BatchState, interval: float) -> state.BatchState:
    columns = (
        # markup=False: a batch named "[/x]" is a name, not a rich tag (MarkupError).
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}", markup=False),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        name = printable(found.name, multiline=False)
        bar = progress.add_task(name, total=found.total, detail="")
        while True:
            settled = found.total - found.pending
            detail = f"{found.succeeded} ok, {found.dead} dead, {found.cancelled} cancelled"
            progress.update(bar, total=found.total, completed=settled, detail=detail)
            if found.pending == 0:
                return found
            time.sleep(interval)
            found = _get(ctx, found.id)


@batch.command("cancel")
@batch_id_argument
@click.option("--reason", required=True, callback=_reason, help="Why (stored with the batch).")
@click.pass_context
def cancel(ctx: click.Context, batch_id: str, reason: str) -> None:
    """Members not started yet will not run (counted cancelled); running ones finish."""
    app: Any = ctx.obj.app
    done = False
    try:
        done = create.cancel(app, batch_id, reason)
    except KeyError:
        click.echo(f"no batch {printable(batch_id, multiline=False)!r}", err=True)
        ctx.exit(1)
    except Exception as exc:
        raise _failed("cannot cancel the batch", exc) from exc
    click.echo(f"batch {batch_id} cancelled" if done else f"batch {batch_id} was already cancelled")
