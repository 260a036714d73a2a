"""``celery -A APP dlq ...``: list, inspect, replay, discard and purge dead letters.

Human output is a table; ``--json`` prints one JSON object per row (JSON Lines) on
stdout. Bulk operations show progress on stderr, so ``--json`` output stays parseable.
Every change needs ``--reason`` and records who did it (``--actor``, default
``$USER@host``).
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import re
import socket
import time
from collections.abc import Iterable
from typing import Any

import click
import sqlalchemy as sa
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from jobs_platform import db as platform_db
from jobs_platform.deadletter.model import REASONS, STATUSES, TABLE
from jobs_platform.deadletter.record import parse_time, utcnow
from jobs_platform.deadletter.replay import ReplayRefused, check_replayable, publisher
from jobs_platform.deadletter.sink import sink_for
from jobs_platform.deadletter.store import DeadLetterStore, Filter

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
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


def parse_since(value: str | None) -> dt.datetime | None:
    """``30m``, ``2h``, ``7d`` (ago) or an ISO time (UTC when no offset)."""
    if value is None:
        return None
    match = _DURATION.match(value.strip())
    if match:
        return utcnow() - dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])
    moment = parse_time(value)
    if moment is None:
        raise click.BadParameter(f"{value!r} is neither a duration (30m, 2h, 7d) nor a time")
    return moment


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
        with store.engine.connect() as conn:
            exists = sa.inspect(conn).has_table(TABLE)
    except sa.exc.SQLAlchemyError as exc:
        raise click.ClickException(f"cannot reach the database at {_shown(url)}: {exc}") from exc
    if not exists:
        raise click.ClickException(
            f"the {TABLE} table does not exist in {_shown(url)}: "
            "run `celery -A APP db upgrade` first (workers create it at start unless "
            "JOBS_AUTO_MIGRATE=0)"
        )
    return store


def _shown(url: str) -> str:
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<database url>"


def _actor(value: str | None) -> str:
    if value:
        return value
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _reason_text(value: str) -> str:
    if not value.strip():
        raise click.BadParameter("give a reason: it is kept with the row")
    return value.strip()


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    out = {key: row.get(key) for key in JSON_KEYS}
    out["errors"] = [
        {
            "type": e.get("type"),
            "message": e.get("message"),
            "at": e.get("at"),
            "attempt": e.get("attempt"),
        }
        for e in (row.get("errors") or [])
    ]
    return out


def _json_default(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)


def _emit_json(rows: Iterable[dict[str, Any]]) -> None:
    for row in rows:
        click.echo(json.dumps(_jsonable(row), default=_json_default))


def _when(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value else ""


def _table(rows: list[dict[str, Any]], title: str) -> None:
    table = Table(title=title)
    for name in ("id", "failed (UTC)", "task", "queue", "reason", "tries", "status", "error"):
        table.add_column(name, overflow="fold")
    for r in rows:
        error = f"{r['error_type'].rsplit('.', 1)[-1]}: {r['error_message']}"
        table.add_row(
            str(r["id"]),
            _when(r["failed_at"]),
            r["task_name"] or "?",
            r["queue"],
            r["reason"],
            str(r["attempts"]),
            r["status"],
            error[:80],
        )
    Console().print(table)


def _filter_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option("--task", help="Task name."),
            click.option("--queue", help="Queue the job was in."),
            click.option("--fingerprint", help="Error fingerprint (see `dlq stats`)."),
            click.option("--since", help="Failed since: 30m, 2h, 7d or an ISO time."),
        ]
    ):
        fn = option(fn)
    return fn


@click.group("dlq")
def dlq() -> None:
    """Dead letters: jobs that failed for good (list, show, stats, replay, discard, purge)."""


@dlq.command("list")
@_filter_options
@click.option("--reason", type=click.Choice(REASONS), help="Why the job died.")
@click.option("--status", type=click.Choice(STATUSES), help="dead / replayed / discarded.")
@click.option("--page", default=1, show_default=True, type=click.IntRange(min=1))
@click.option("--page-size", default=50, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row.")
@click.pass_context
def list_(
    ctx: click.Context,
    task: str | None,
    queue: str | None,
    fingerprint: str | None,
    since: str | None,
    reason: str | None,
    status: str | None,
    page: int,
    page_size: int,
    as_json: bool,
) -> None:
    """Dead letters, newest first."""
    where = Filter(
        task=task,
        queue=queue,
        fingerprint=fingerprint,
        since=parse_since(since),
        reason=reason,
        status=status,
    )
    rows = _store(ctx).listing(where, page=page, page_size=page_size)
    if as_json:
        _emit_json(rows)
    else:
        _table(rows, f"Dead letters (page {page}, {len(rows)} rows)")


@dlq.command("show")
@click.argument("row_id", type=int)
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def show(ctx: click.Context, row_id: int, as_json: bool) -> None:
    """One dead letter with its payload, error history and traceback."""
    row = _store(ctx).get(row_id)
    if row is None:
        raise click.ClickException(f"no dead letter {row_id}")
    if as_json:
        _emit_json([row])
        return
    console = Console()
    for key in (
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
    ):
        value = row[key]
        if value is not None and value != "":
            console.print(f"[bold]{key}[/bold]: {value}", highlight=False)
    console.print(f"[bold]args[/bold]: {json.dumps(row['args'])}", highlight=False)
    console.print(f"[bold]kwargs[/bold]: {json.dumps(row['kwargs'])}", highlight=False)
    if row["redacted"]:
        console.print("[yellow]secrets were redacted from this payload[/yellow]")
    if row["raw_body"] is not None:
        console.print(
            f"[bold]raw body[/bold] ({row['content_type']}, "
            f"{row['raw_body_encoding']}): {row['raw_body'][:2000]}",
            highlight=False,
        )
    table = Table(title="Errors, in order")
    for name in ("#", "at (UTC)", "type", "message"):
        table.add_column(name, overflow="fold")
    for e in row["errors"] or []:
        table.add_row(
            str(e.get("attempt")), str(e.get("at")), str(e.get("type")), str(e.get("message"))
        )
    console.print(table)
    if row["traceback"]:
        console.print("[bold]traceback[/bold]:")
        click.echo(row["traceback"])


@dlq.command("stats")
@_filter_options
@click.option("--status", type=click.Choice(STATUSES), default="dead", show_default=True)
@click.option("--top", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def stats(
    ctx: click.Context,
    task: str | None,
    queue: str | None,
    fingerprint: str | None,
    since: str | None,
    status: str,
    top: int,
    as_json: bool,
) -> None:
    """Counts by task and by error fingerprint."""
    where = Filter(
        task=task, queue=queue, fingerprint=fingerprint, since=parse_since(since), status=status
    )
    result = _store(ctx).stats(where, top=top)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "total": result.total,
                    "by_status": result.by_status,
                    "by_task": result.by_task,
                    "by_fingerprint": result.by_fingerprint,
                },
                default=_json_default,
            )
        )
        return
    console = Console()
    console.print(f"{result.total} dead letter(s) with status {status}")
    by_task = Table(title="By task")
    by_task.add_column("task")
    by_task.add_column("count", justify="right")
    for item in result.by_task:
        by_task.add_row(item["task_name"] or "?", str(item["count"]))
    console.print(by_task)
    groups = Table(title="By fingerprint")
    for name in ("fingerprint", "task", "count", "last failed", "error"):
        groups.add_column(name, overflow="fold")
    for g in result.by_fingerprint:
        groups.add_row(
            g["fingerprint"],
            g["task_name"] or "?",
            str(g["count"]),
            _when(g["last_failed_at"]),
            f"{g['error_type'].rsplit('.', 1)[-1]}: {g['error_message'][:60]}",
        )
    console.print(groups)


class _NoProgress:
    def __enter__(self) -> _NoProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def advance(self, *args: Any) -> None:
        return None


def _progress(total: int, label: str, *, shown_from: int) -> Any:
    """A progress bar on stderr for bulk operations (stdout stays clean for ``--json``)."""
    if total < shown_from:
        return _NoProgress()
    return Progress(console=Console(stderr=True), transient=True)


def _selected(store: DeadLetterStore, ids: tuple[int, ...], where: Filter) -> list[int]:
    """Ids given, or those matching the filter (only ``dead`` rows)."""
    if ids:
        return list(ids)
    if where == Filter(status="dead"):
        raise click.UsageError("give dead-letter IDs or a filter (--task, --fingerprint, ...)")
    return [i for batch in store.ids(where) for i in batch]


@dlq.command("replay")
@click.argument("ids", nargs=-1, type=int)
@_filter_options
@click.option("--reason", "reason", required=True, help="Why (kept with the row).")
@click.option("--actor", help="Who (default $USER@host).")
@click.option("--dry-run", is_flag=True, help="Show what would be replayed; change nothing.")
@click.option(
    "--rate",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="At most this many replays per second.",
)
@click.option("--allow-redacted", is_flag=True, help="Replay rows whose secrets were masked.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def replay(
    ctx: click.Context,
    ids: tuple[int, ...],
    task: str | None,
    queue: str | None,
    fingerprint: str | None,
    since: str | None,
    reason: str,
    actor: str | None,
    dry_run: bool,
    rate: float,
    allow_redacted: bool,
    as_json: bool,
) -> None:
    """Send dead jobs again (original payload, queue, priority; fresh attempt budget)."""
    reason = _reason_text(reason)
    store = _store(ctx)
    where = Filter(
        task=task, queue=queue, fingerprint=fingerprint, since=parse_since(since), status="dead"
    )
    selected = _selected(store, ids, where)
    publish = publisher(ctx.obj.app)
    results: list[dict[str, Any]] = []
    with _progress(len(selected), "replaying", shown_from=2) as progress:
        bar = progress.add_task("replaying", total=len(selected))
        for row_id in selected:
            results.append(
                _replay_one(
                    store,
                    row_id,
                    reason=reason,
                    actor=_actor(actor),
                    dry_run=dry_run,
                    allow_redacted=allow_redacted,
                    publish=publish,
                )
            )
            progress.advance(bar)
            if not dry_run and results[-1]["outcome"] == "replayed":
                time.sleep(1.0 / rate)  # throttle: a replay storm must not flood the queue
    _report(results, as_json, "replay" + (" (dry run)" if dry_run else ""))


def _replay_one(
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
    new_id = store.replay(row_id, reason=reason, actor=actor, publish=publish)
    if new_id is None:
        return {"id": row_id, "outcome": "already_resolved"}
    return {"id": row_id, "outcome": "replayed", "task_id": new_id}


def _report(results: list[dict[str, Any]], as_json: bool, what: str) -> None:
    if as_json:
        for item in results:
            click.echo(json.dumps(item, default=str))
        return
    counts: dict[str, int] = {}
    for item in results:
        counts[item["outcome"]] = counts.get(item["outcome"], 0) + 1
        detail = item.get("task_id") or item.get("why") or ""
        click.echo(f"{item['id']}: {item['outcome']} {detail}".rstrip())
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "nothing selected"
    click.echo(f"{what}: {summary}")


@dlq.command("discard")
@click.argument("ids", nargs=-1, type=int)
@_filter_options
@click.option("--failure-reason", type=click.Choice(REASONS), help="Filter: why it died.")
@click.option("--reason", "reason", required=True, help="Why it is discarded (kept).")
@click.option("--actor", help="Who (default $USER@host).")
@click.option("--dry-run", is_flag=True)
@click.pass_context
def discard(
    ctx: click.Context,
    ids: tuple[int, ...],
    task: str | None,
    queue: str | None,
    fingerprint: str | None,
    since: str | None,
    failure_reason: str | None,
    reason: str,
    actor: str | None,
    dry_run: bool,
) -> None:
    """Mark dead jobs as discarded (they stay listed, with the reason)."""
    reason = _reason_text(reason)
    store = _store(ctx)
    where = Filter(
        task=task,
        queue=queue,
        fingerprint=fingerprint,
        since=parse_since(since),
        reason=failure_reason,
        status="dead",
    )
    selected = _selected(store, ids, where)
    if dry_run:
        click.echo(
            f"would discard {len(selected)} dead letter(s): {', '.join(map(str, selected[:50]))}"
        )
        return
    moved = 0
    with _progress(len(selected), "discarding", shown_from=500) as progress:
        bar = progress.add_task("discarding", total=len(selected))
        for start in range(0, len(selected), 500):
            chunk = selected[start : start + 500]
            moved += store.discard(chunk, reason=reason, actor=_actor(actor))
            progress.advance(bar, len(chunk))
    click.echo(f"discarded {moved} of {len(selected)} selected (others were not dead)")


@dlq.command("purge")
@click.option("--older-than", required=True, help="Age: 30d, 12h, ... (by failure time).")
@click.option(
    "--include-dead",
    is_flag=True,
    help="Also delete rows nobody resolved (default: only replayed/discarded).",
)
@click.option("--dry-run", is_flag=True)
@click.pass_context
def purge(ctx: click.Context, older_than: str, include_dead: bool, dry_run: bool) -> None:
    """Delete old resolved dead letters (retention)."""
    match = _DURATION.match(older_than.strip())
    if not match:
        raise click.BadParameter("use a duration such as 30d or 12h", param_hint="--older-than")
    cutoff = utcnow() - dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])
    statuses = STATUSES if include_dead else ("replayed", "discarded")
    store = _store(ctx)
    if dry_run:
        count = sum(
            store.count(Filter(status=s)) - store.count(Filter(status=s, since=cutoff))
            for s in statuses
        )
        click.echo(f"would delete {count} row(s) that failed before {cutoff:%Y-%m-%d %H:%M} UTC")
        return
    deleted = store.purge(cutoff, statuses=statuses)
    click.echo(f"deleted {deleted} row(s) that failed before {cutoff:%Y-%m-%d %H:%M} UTC")


@dlq.command("drain")
@click.pass_context
def drain(ctx: click.Context) -> None:
    """Move dead letters waiting in the spool (database was down) into the table now."""
    _store(ctx, migrate=True)
    sink = sink_for(ctx.obj.app)
    before = sink.spool.depth()
    client, rejected_key = sink.spool.client, sink.spool.rejected_key
    rejected_before = int(client.llen(rejected_key))
    settled = sink.drain()
    rejected = int(client.llen(rejected_key)) - rejected_before
    click.echo(f"moved {settled - rejected} of {before} spooled dead letter(s) into the table")
    if rejected > 0:
        click.echo(
            f"{rejected} refused by the database for good, moved to {rejected_key} "
            "(see the log lines jobs.dlq.rejected)",
            err=True,
        )
