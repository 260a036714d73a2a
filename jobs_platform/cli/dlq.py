"""``celery -A APP dlq ...``: list, inspect, replay, discard and purge dead letters.

Human output is a table; ``--json`` prints one JSON object per row (JSON Lines) on
stdout. Messages, refusals and progress go to stderr, so ``--json`` output stays
parseable. Every change needs ``--reason`` (why you act) and records who did it
(``--actor``, default ``$USER@host``); ``--failure-reason`` selects rows by why the job
died. Exit codes: see :mod:`jobs_platform.cli.bulk` and ``dlq --help``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging

import click
import sqlalchemy.exc
from rich.console import Console

from jobs_platform import db as platform_db
from jobs_platform.cli import bulk, render
from jobs_platform.cli.options import (
    actor_option,
    dry_run_option,
    filter_options,
    json_option,
    justification,
    older_than_option,
    reason_moved,
)
from jobs_platform.cli.text import printable
from jobs_platform.clock import utcnow
from jobs_platform.deadletter.drainer import drainer_for
from jobs_platform.deadletter.model import STATUSES, TABLE
from jobs_platform.deadletter.replay import replay_rows
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.urls import masked

logger = logging.getLogger("jobs_platform.deadletter")


def _store(ctx: click.Context, *, migrate: bool = False) -> DeadLetterStore:
    """The store; only ``migrate=True`` (``dlq drain``) may apply migrations.

    Every other command reads or changes existing rows: it never migrates (a listing must
    not alter a schema) and, when the table is missing, says how to create it.
    """
    settings = ctx.obj.app.jobs_settings
    url = settings.database_url
    if migrate and settings.auto_migrate:
        platform_db.upgrade(url)
    store = DeadLetterStore(url)
    try:
        exists = store.has_table()
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise click.ClickException(f"cannot reach the database at {masked(url)}: {exc}") from exc
    if not exists:
        raise click.ClickException(
            f"the {TABLE} table does not exist in {masked(url)}: "
            "run `celery -A APP db upgrade` first (workers create it at start unless "
            "JOBS_AUTO_MIGRATE=0)"
        )
    return store


@click.group("dlq")
def dlq() -> None:
    """Dead letters: jobs that failed for good (list, show, stats, replay, discard, purge).

    \b
    --failure-reason  filter: why the job died (exhausted, permanent, poison, ...)
    --reason          why you replay, discard or purge (kept with the row, or logged)

    \b
    Exit codes:
      0  done (with --dry-run: would be done)
      1  refused: a row was missing, no longer dead, redacted or not replayable (the
         other rows were still processed), or the command could not run
      2  usage error: nothing was done
    """


@dlq.command("list")
@filter_options(status_option=True)
@reason_moved
@click.option("--page", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--page-size", default=50, show_default=True, type=click.IntRange(1, 1000))
@json_option
@click.pass_context
def list_(ctx: click.Context, where: Filter, page: int, page_size: int, as_json: bool) -> None:
    """Dead letters, newest first."""
    rows = _store(ctx).listing(where, page=page, page_size=page_size)
    if as_json:
        render.emit_json(map(render.jsonable, rows))
    else:
        render.dead_letters(Console(), rows, f"Dead letters (page {page}, {len(rows)} rows)")


@dlq.command("show")
@click.argument("row_id", type=int)
@json_option
@click.pass_context
def show(ctx: click.Context, row_id: int, as_json: bool) -> None:
    """One dead letter with its payload, error history and traceback."""
    row = _store(ctx).get(row_id)
    if row is None:
        raise click.ClickException(f"no dead letter {row_id}")
    if as_json:
        render.emit_json([render.jsonable(row)])
    else:
        render.show(Console(), row)


@dlq.command("stats")
@filter_options(status="dead", status_option=True)
@reason_moved
@click.option("--top", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option(
    "--exact",
    is_flag=True,
    help="Count the rows themselves (a GROUP BY over every matching row) instead of the "
    "group counts the database keeps; --since always does.",
)
@json_option
@click.pass_context
def stats(ctx: click.Context, where: Filter, top: int, exact: bool, as_json: bool) -> None:
    """Counts by task and by error fingerprint."""
    result = _store(ctx).stats(where, top=top, exact=exact)
    if as_json:
        render.emit_json([dataclasses.asdict(result)])  # total, by_status, by_task, ...
    else:
        render.stats(Console(), result, where.status or "any")


@dlq.command("replay")
@click.argument("ids", nargs=-1, type=int)
@filter_options(status="dead")
@justification("Why you replay (kept with the row).")
@actor_option
@dry_run_option
@click.option(
    "--rate",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="At most this many replays per second.",
)
@click.option("--allow-redacted", is_flag=True, help="Replay rows whose secrets were masked.")
@json_option
@click.pass_context
def replay(
    ctx: click.Context,
    ids: tuple[int, ...],
    where: Filter,
    reason: str,
    actor: str,
    dry_run: bool,
    rate: float,
    allow_redacted: bool,
    as_json: bool,
) -> None:
    """Send dead jobs again (original payload, queue, priority; fresh attempt budget)."""
    bulk.check_selection(ids, where)
    store = _store(ctx)
    selected = bulk.selected(store, ids, where)
    outcomes = list(
        bulk.with_progress(
            replay_rows(
                ctx.obj.app,
                store,
                selected,
                reason=reason,
                actor=actor,
                rate=rate,
                dry_run=dry_run,
                allow_redacted=allow_redacted,
            ),
            len(selected),
            "replaying",
        )
    )
    if as_json:
        render.emit_json(map(render.outcome_json, outcomes))
    else:
        render.replayed(outcomes, dry_run=dry_run)
    refused = sum(not item.done for item in outcomes)
    bulk.conclude(ctx, "replay (dry run)" if dry_run else "replay", len(outcomes), refused)


@dlq.command("discard")
@click.argument("ids", nargs=-1, type=int)
@filter_options(status="dead")
@justification("Why you discard (kept with the row).")
@actor_option
@dry_run_option
@click.pass_context
def discard(
    ctx: click.Context,
    ids: tuple[int, ...],
    where: Filter,
    reason: str,
    actor: str,
    dry_run: bool,
) -> None:
    """Mark dead jobs as discarded (they stay listed, with the reason)."""
    bulk.check_selection(ids, where)
    store = _store(ctx)
    selected = bulk.selected(store, ids, where)
    # A filter selects dead rows only; IDs given by hand may be anything.
    refusals = bulk.not_dead(store, selected) if ids else []
    refused_ids = {item.id for item in refusals}
    todo = [i for i in selected if i not in refused_ids]
    render.refusals(refusals)
    if dry_run:
        shown = ", ".join(map(str, todo[:50])) + (" ..." if len(todo) > 50 else "")
        click.echo(f"would discard {len(todo)} of {len(selected)} selected: {shown}".rstrip())
        bulk.conclude(ctx, "discard (dry run)", len(selected), len(refusals))
        return
    moved = bulk.discard_rows(store, todo, reason=reason, actor=actor)
    click.echo(f"discarded {moved} of {len(selected)} selected")
    if moved < len(todo):
        click.echo(
            f"{len(todo) - moved} were replayed or discarded by someone else meanwhile", err=True
        )
    bulk.conclude(ctx, "discard", len(selected), len(selected) - moved)


@dlq.command("purge")
@older_than_option
@click.option(
    "--include-dead",
    is_flag=True,
    help="Also delete rows nobody resolved (default: only replayed/discarded).",
)
@justification("Why you delete them (printed and logged with the count).")
@actor_option
@dry_run_option
@click.pass_context
def purge(
    ctx: click.Context,
    older_than: dt.timedelta,
    include_dead: bool,
    reason: str,
    actor: str,
    dry_run: bool,
) -> None:
    """Delete old resolved dead letters (retention)."""
    cutoff = utcnow() - older_than
    statuses = STATUSES if include_dead else ("replayed", "discarded")
    store = _store(ctx)
    before = f"failed before {cutoff:%Y-%m-%d %H:%M} UTC"
    if dry_run:
        count = sum(
            store.count(Filter(status=s)) - store.count(Filter(status=s, since=cutoff))
            for s in statuses
        )
        click.echo(f"would delete {count} row(s) that {before}")
        return
    deleted = store.purge(cutoff, statuses=statuses)
    # The rows are gone: this line (and the log record) is what remains of the decision.
    click.echo(printable(f"deleted {deleted} row(s) that {before} (reason: {reason}; by {actor})"))
    logger.info(
        "jobs.dlq.purged: %d row(s) that %s, reason %r, by %s",
        deleted,
        before,
        reason,
        actor,
        extra={"event": "jobs.dlq.purged", "count": deleted, "reason": reason, "actor": actor},
    )


@dlq.command("recount")
@click.pass_context
def recount(ctx: click.Context) -> None:
    """Rebuild the group counts behind `dlq stats` from the rows.

    Triggers keep them with every write, whoever writes; this is for what skips triggers
    (a restore of the table alone, session_replication_role = replica). Writers wait while
    it runs (one GROUP BY over the table).
    """
    store = _store(ctx)
    try:
        groups = store.recount()
    except sqlalchemy.exc.SQLAlchemyError as exc:
        raise click.ClickException(f"recount failed, the counts are as they were: {exc}") from exc
    click.echo(f"recounted {store.count()} row(s) into {groups} group(s)")


@dlq.command("drain")
@click.pass_context
def drain(ctx: click.Context) -> None:
    """Move dead letters waiting in the spool (database was down) into the table now."""
    _store(ctx, migrate=True)
    drainer = drainer_for(ctx.obj.app)
    done = drainer.drain()
    render.drained(done, drainer.sink.spool)
    if done.stopped_by is not None:
        raise click.ClickException(
            f"the database failed, the rest waits in the spool: {done.stopped_by}"
        )
