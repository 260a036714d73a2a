"""Options shared by the ``dlq`` commands: one name per meaning, checked at parse time.

``--failure-reason`` selects rows by why the job died (exhausted, permanent, ...) in every
command that selects rows; ``--reason`` is always the operator's justification, kept with
the row (replay, discard) or logged (purge). ``list``/``stats`` used to call the filter
``--reason``: there it is now a usage error naming ``--failure-reason``, never a silent
reinterpretation.

Every free-text option goes through :func:`~jobs_platform.cli.text.check_text`: text no
database can hold (NUL, bytes that are not UTF-8) is a usage error naming the option.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import getpass
import re
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import click

from jobs_platform.cli.text import check_text, printable
from jobs_platform.clock import utcnow
from jobs_platform.deadletter.model import REASONS, STATUSES
from jobs_platform.deadletter.record import parse_time
from jobs_platform.deadletter.store import Filter

F = TypeVar("F", bound=Callable[..., Any])

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str) -> dt.timedelta | None:
    """``30m``, ``2h``, ``7d``...; ``None`` if ``value`` is not a duration."""
    match = _DURATION.match(value.strip())
    if match is None:
        return None
    return dt.timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def parse_since(value: str | None) -> dt.datetime | None:
    """``30m``, ``2h``, ``7d`` (ago) or an ISO time (UTC when no offset)."""
    if value is None:
        return None
    ago = parse_duration(value)
    if ago is not None:
        return utcnow() - ago
    moment = parse_time(value)
    if moment is None:
        raise click.BadParameter(f"{value!r} is neither a duration (30m, 2h, 7d) nor a time")
    return moment


def _since(ctx: click.Context, param: click.Parameter, value: str | None) -> dt.datetime | None:
    return parse_since(check_text(ctx, param, value))


def _older_than(ctx: click.Context, param: click.Parameter, value: str) -> dt.timedelta:
    age = parse_duration(value)
    if age is None:
        raise click.BadParameter("use a duration such as 30d or 12h", ctx, param)
    return age


older_than_option = click.option(
    "--older-than",
    required=True,
    callback=_older_than,
    help="Age: 30d, 12h, ... (by failure time).",
)


def filter_options(*, status: str | None = None, status_option: bool = False) -> Callable[[F], F]:
    """Add the row filter and pass it to the command as one ``where: Filter``.

    ``status`` is the fixed status of the rows (replay/discard act on ``dead`` ones only),
    or with ``status_option`` the default of a ``--status`` option.
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def command(*args: Any, **kwargs: Any) -> Any:
            where = Filter(
                task=kwargs.pop("task"),
                queue=kwargs.pop("queue"),
                fingerprint=kwargs.pop("fingerprint"),
                since=kwargs.pop("since"),
                reason=kwargs.pop("failure_reason"),
                status=kwargs.pop("status") if status_option else status,
            )
            return fn(*args, where=where, **kwargs)

        options = [
            click.option("--task", callback=check_text, help="Task name."),
            click.option("--queue", callback=check_text, help="Queue the job was in."),
            click.option(
                "--fingerprint",
                callback=check_text,
                help="Error fingerprint (see `dlq stats`).",
            ),
            click.option(
                "--since", callback=_since, help="Failed since: 30m, 2h, 7d or an ISO time."
            ),
            click.option(
                "--failure-reason",
                type=click.Choice(REASONS),
                help="Filter by why the job died (not --reason).",
            ),
        ]
        if status_option:
            options.append(
                click.option(
                    "--status",
                    type=click.Choice(STATUSES),
                    default=status,
                    show_default=status is not None,
                    help="dead / replayed / discarded.",
                )
            )
        for option in reversed(options):
            command = option(command)
        return command  # type: ignore[return-value]

    return decorate


def unfiltered(where: Filter) -> bool:
    """Whether no filter option was given (the status alone selects everything)."""
    return dataclasses.replace(where, status=None) == Filter()


def _moved(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        raise click.BadParameter(
            "--reason is the operator's justification (replay, discard, purge); to select rows "
            f"by why the job died use --failure-reason {printable(value, multiline=False)}",
            ctx=ctx,
            param=param,
        )


#: ``list``/``stats``: the filter's old name fails loudly instead of meaning something else.
reason_moved = click.option(
    "--reason", hidden=True, expose_value=False, is_eager=True, callback=_moved
)


def _justification(ctx: click.Context, param: click.Parameter, value: str) -> str:
    text = str(check_text(ctx, param, value)).strip()
    if not text:
        raise click.BadParameter("give a reason: it is recorded with the change", ctx, param)
    if text in REASONS:
        # "--reason poison" was meant as the filter: acting on every row of the
        # selection with "poison" as the justification would be the wrong operation.
        raise click.BadParameter(
            f"{text!r} is why a job died, not why you act: select those rows with "
            f'--failure-reason {text} and say why in --reason (e.g. "INC-42 fixed")',
            ctx,
            param,
        )
    return text


def justification(help_text: str) -> Callable[[F], F]:
    """The required ``--reason``: why the operator acts (recorded with the change)."""
    return click.option("--reason", required=True, callback=_justification, help=help_text)


def _actor(ctx: click.Context, param: click.Parameter, value: str | None) -> str:
    if value:
        return str(check_text(ctx, param, value))
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


actor_option = click.option("--actor", callback=_actor, help="Who (default $USER@host).")
json_option = click.option(
    "--json", "as_json", is_flag=True, help="JSON on stdout (one object per line)."
)
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Show what would change; change nothing."
)
