"""``celery -A APP delayed ...``: list, inspect and cancel jobs waiting in the delayed store.

Human output is a table (ids and task names never wrap); ``--json`` prints one JSON
object per job (JSON Lines) on stdout, messages and refusals go to stderr. ``cancel``
needs ``--reason`` (logged with who did it). Exit codes as ``dlq``: 0 done, 1 refused
(an id was not, or no longer, delayed) or could not run, 2 usage error.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
from collections.abc import Iterator
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from jobs_platform import brokers
from jobs_platform.cli import render
from jobs_platform.cli.bulk import conclude
from jobs_platform.cli.options import actor_option, json_option, parse_duration
from jobs_platform.cli.text import check_utf8, printable
from jobs_platform.clock import utcnow
from jobs_platform.deadletter.record import parse_time, redact
from jobs_platform.delayed import cancel_delayed, store_of

logger = logging.getLogger("jobs_platform.delayed")

#: Celery headers that repeat the arguments verbatim (``show`` prints them redacted instead).
_ARGUMENT_HEADERS = ("argsrepr", "kwargsrepr")
#: Fields ``show`` prints one per line, in this order (then arguments and headers).
_SHOWN = (
    "task_id",
    "task_name",
    "queue",
    "priority",
    "list",
    "due_at",
    "in",
    "eta",
    "stored_at",
    "retries",
)


def _moment(ctx: click.Context, param: click.Parameter, value: str | None) -> dt.datetime | None:
    """``2h`` (from now), ``30m``, ``7d`` or an ISO time (UTC when no offset)."""
    if value is None:
        return None
    ahead = parse_duration(value)
    if ahead is not None:
        return utcnow() + ahead
    moment = parse_time(value)
    if moment is None:
        raise click.BadParameter("use a duration from now (30m, 2h, 7d) or an ISO time", ctx, param)
    return moment


def _reason(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not check_utf8(ctx, param, value).strip():
        raise click.BadParameter("give a reason: it is logged with the cancellation", ctx, param)
    return value.strip()


def _ms(moment: dt.datetime | None) -> float | None:
    return None if moment is None else moment.timestamp() * 1000


def _time(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC)


def _until(ms: int, now: dt.datetime) -> str:
    """How long until ``ms``: ``3d4h``, ``2h5m``, ``40s``; negative when overdue."""
    seconds = round(ms / 1000 - now.timestamp())
    sign, left = ("-" if seconds < 0 else ""), abs(seconds)
    days, left = divmod(left, 86400)
    hours, left = divmod(left, 3600)
    minutes, secs = divmod(left, 60)
    if days:
        return f"{sign}{days}d{hours}h"
    if hours:
        return f"{sign}{hours}h{minutes}m"
    return f"{sign}{minutes}m{secs}s" if minutes else f"{sign}{secs}s"


#: How long the commands wait for the broker to answer before saying it does not.
PING_TIMEOUT_S = 5.0


def _store(ctx: click.Context) -> Any:
    """The app's store of waiting jobs, once its broker has answered."""
    app = ctx.obj.app
    broker = brokers.of(app)
    store = store_of(app)
    if store is None:
        raise click.ClickException(
            f"the {broker.name} broker delays jobs itself: there is no store to read"
        )
    ok, said = broker.ping(str(app.conf.broker_url), PING_TIMEOUT_S)
    if not ok:
        raise click.ClickException(f"cannot reach the broker: {said}")
    return store


def summary(job: Any) -> dict[str, Any]:
    """``--json`` of ``list`` (and the head of ``show``)."""
    return {
        "task_id": job.id,
        "task_name": job.task,
        "queue": job.queue,
        "priority": job.priority,
        "due_at": _time(job.due),
        "eta": job.eta,
        "stored_at": _time(job.stored),
        "list": job.list,
    }


def detail(job: Any, redact_keys: list[str]) -> dict[str, Any]:
    """``summary`` plus the arguments (secrets masked) and the message headers."""
    message = job.message
    headers = dict(message.get("headers") or {})
    args, kwargs = _arguments(message)
    kwargs, masked_any = redact(kwargs, redact_keys)
    args, masked_args = redact(args, redact_keys)
    for name in _ARGUMENT_HEADERS:
        headers.pop(name, None)
    return {
        **summary(job),
        "retries": headers.get("retries", 0),
        "args": args,
        "kwargs": kwargs,
        "redacted": masked_any or masked_args,
        "headers": headers,
    }


def _arguments(message: dict[str, Any]) -> tuple[Any, Any]:
    """``(args, kwargs)`` of a protocol-2 JSON message; ``(None, None)`` if unreadable."""
    try:
        body = message["body"]
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args, kwargs, _embed = json.loads(body)
        return args, kwargs
    except (KeyError, TypeError, ValueError):
        return None, None


@click.group("delayed")
def delayed() -> None:
    """Delayed jobs: waiting in the store until due (list, show, cancel).

    \b
    Exit codes:
      0  done
      1  refused: an id was not (or no longer) delayed, or the command could not run
      2  usage error: nothing was done
    """


@delayed.command("list")
@click.option("--task", callback=check_utf8, help="Task name.")
@click.option("--queue", callback=check_utf8, help="Queue the job will be released onto.")
@click.option("--due-after", callback=_moment, help="Due at or after: 30m, 2h, 7d (from now), ISO.")
@click.option(
    "--due-before", callback=_moment, help="Due at or before: 30m, 2h, 7d (from now), ISO."
)
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1, 100_000))
@json_option
@click.pass_context
def list_(
    ctx: click.Context,
    task: str | None,
    queue: str | None,
    due_after: dt.datetime | None,
    due_before: dt.datetime | None,
    limit: int,
    as_json: bool,
) -> None:
    """Delayed jobs, soonest due first."""
    store = _store(ctx)
    selected = list(_select(store, task, queue, due_after, due_before, limit))
    if as_json:
        render.emit_json(map(summary, selected))
        return
    now = utcnow()
    out = render.table(
        f"Delayed jobs ({len(selected)} shown of {store.count()} waiting)",
        ("task id", "due (UTC)", "in", "task", "queue", "priority"),
        right=("in", "priority"),
    )
    for job in selected:
        out.add_row(
            *render.cells(
                (
                    job.id,
                    render.when(_time(job.due)),
                    _until(job.due, now),
                    job.task,
                    job.queue,
                    job.priority,
                )
            )
        )
    render.print_table(Console(), out)


def _select(
    store: Any,
    task: str | None,
    queue: str | None,
    due_after: dt.datetime | None,
    due_before: dt.datetime | None,
    limit: int,
) -> Iterator[Any]:
    found = 0
    for job in store.scan(due_after_ms=_ms(due_after), due_before_ms=_ms(due_before)):
        if (task is None or job.task == task) and (queue is None or job.queue == queue):
            yield job
            found += 1
            if found >= limit:
                return


@delayed.command("show")
@click.argument("task_id", callback=check_utf8)
@json_option
@click.pass_context
def show(ctx: click.Context, task_id: str, as_json: bool) -> None:
    """One delayed job: when it is due, where it goes, its arguments and headers."""
    job = _store(ctx).get(task_id)
    if job is None:
        raise click.ClickException(
            f"{printable(task_id, multiline=False)} is not delayed "
            "(never stored, released or cancelled)"
        )
    redact_keys = ctx.obj.app.jobs_settings.dlq_redact_keys.split(",")
    row = detail(job, redact_keys)
    if as_json:
        render.emit_json([row])
        return
    console = Console()
    row["in"] = _until(job.due, utcnow())
    # A priority sub-list's name holds control characters (kombu's separator): escaped.
    row["list"] = job.list.encode("unicode_escape").decode()
    for key in _SHOWN:
        _line(console, key, str(row[key]))
    _line(console, "args", json.dumps(row["args"]))
    _line(console, "kwargs", json.dumps(row["kwargs"]))
    if row["redacted"]:
        console.print("secrets were masked in this output", style="yellow")
    _line(console, "headers", json.dumps(row["headers"], default=str))


def _line(console: Console, key: str, value: str) -> None:
    # soft_wrap: an id, a task name or a header line stays one line whatever the width.
    # Text, printable: a message's task name is neither markup nor terminal control.
    line = Text.assemble((key, "bold"), ": ", printable(value, multiline=False))
    console.print(line, soft_wrap=True)


@delayed.command("cancel")
@click.argument("task_ids", nargs=-1, required=True, callback=check_utf8)
@click.option("--reason", required=True, callback=_reason, help="Why you cancel (logged).")
@actor_option
@json_option
@click.pass_context
def cancel(
    ctx: click.Context, task_ids: tuple[str, ...], reason: str, actor: str, as_json: bool
) -> None:
    """Remove delayed jobs from the store: they are never released, never run.

    A job already released is no longer delayed (exit 1): stop it with
    `celery -A APP control revoke ID` (or AsyncResult(ID).revoke(), which does both).
    """
    _store(ctx)
    outcomes = []
    for task_id in task_ids:
        job = cancel_delayed(ctx.obj.app, task_id)
        outcomes.append({"task_id": task_id, "outcome": "cancelled" if job else "not_delayed"})
        if job is None:
            continue
        outcomes[-1]["task_name"] = job.task
        logger.info(
            "jobs.delayed.cancelled: %s[%s] due %s, reason %r, by %s",
            job.task,
            task_id,
            _time(job.due).isoformat(),
            reason,
            actor,
            extra={
                "event": "jobs.delayed.cancelled",
                "task_id": task_id,
                "reason": reason,
                "actor": actor,
            },
        )
    _report(outcomes, as_json)
    refused = sum(o["outcome"] != "cancelled" for o in outcomes)
    conclude(ctx, "cancel", len(outcomes), refused)


def _report(outcomes: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        render.emit_json(outcomes)
    for item in outcomes:
        task_id = printable(item["task_id"], multiline=False)
        if item["outcome"] != "cancelled":
            click.echo(
                f"{task_id}: not delayed (never stored, already released or cancelled)",
                err=True,
            )
        elif not as_json:
            click.echo(f"{task_id}: cancelled ({printable(item['task_name'], multiline=False)})")
    done = sum(o["outcome"] == "cancelled" for o in outcomes)
    click.echo(f"cancel: {done} of {len(outcomes)} cancelled", err=as_json)
