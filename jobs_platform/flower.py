"""Flower with the platform's defaults: ``celery -A APP flower`` needs no flags.

:func:`install` (called by ``create_app``) hooks Flower only in a process that runs the
``flower`` subcommand; anywhere else it costs a look at click's current context.

Flower 2.2 reads its options from ``FLOWER_*`` variables, then ``flowerconfig.py``, then
its command line; it reads nothing from the Celery app's configuration. So the settings
table reaches Flower in two steps:

1. while ``celery`` loads the app, before Flower reads its own configuration, the
   options :func:`flower_options` derives from the settings become Flower's starting
   values: Flower's own variables, config file and flags still override them;
2. once Flower has read everything (its app calls ``import_default_modules``, which
   sends Celery's ``import_modules`` signal, before it binds its port),
   :func:`check_options` refuses to start without authentication, and the effective
   set-up is logged with passwords masked.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jobs_platform import events
from jobs_platform.errors import ConfigError

if TYPE_CHECKING:
    from jobs_platform.settings import Settings

logger = logging.getLogger("jobs_platform.flower")

COMMAND = "flower"
#: The settings' names, for messages (they are the ``JOBS_*`` variables of the table).
AUTH_SETTING = "JOBS_FLOWER_BASIC_AUTH"
OPT_OUT_SETTING = "JOBS_FLOWER_UNSAFE_NO_AUTH"
#: Columns of Flower's tasks page: its default plus args and kwargs, so an operator sees
#: which job it was without opening each task.
TASKS_COLUMNS = "name,uuid,state,args,kwargs,received,runtime,worker"
#: With persistent state, every worker ever seen stays listed; containers get a new
#: hostname per deploy, so offline ones leave the list after a day.
PURGE_OFFLINE_WORKERS_S = 24 * 3600


def flower_options(settings: Settings) -> dict[str, Any]:
    """Flower's options (Flower's own names and units) that the settings decide."""
    options: dict[str, Any] = {
        # Flower's `enable_events` broadcast (every 5 s) is what switches task events on in
        # `auto` mode; with JOBS_TASK_EVENTS=off the workers refuse it, so it is not sent.
        "enable_events": events.flower_enables_events(settings.task_events),
        "tasks_columns": TASKS_COLUMNS,
        "purge_offline_workers": PURGE_OFFLINE_WORKERS_S,
    }
    if settings.flower_db:
        options.update(
            persistent=True,
            db=settings.flower_db,
            state_save_interval=round(settings.flower_state_save_interval * 1000),
        )
    entries = basic_auth_entries(settings.flower_basic_auth)
    if entries:
        options["basic_auth"] = entries
    return options


def basic_auth_entries(raw: str) -> list[str]:
    """``user:password`` entries from a comma-separated value (Flower's own format)."""
    return [entry.strip() for entry in raw.split(",") if entry.strip()]


def check_options(values: Mapping[str, Any], *, unsafe_no_auth: bool) -> str:
    """Refuse Flower options that would expose it or lose its state; describe the rest.

    ``values`` are Flower's effective options (``options.as_dict()``). Returns a one-line
    description with no password in it.
    """
    basic_auth = list(values.get("basic_auth") or [])
    for number, entry in enumerate(basic_auth, 1):
        user, colon, password = str(entry).partition(":")
        if not (colon and user and password):
            shown = user if colon else "(no colon)"
            raise ConfigError(
                f"Flower basic-auth entry {number} ({shown}) is not user:password "
                f"(set by {AUTH_SETTING}, FLOWER_BASIC_AUTH or --basic-auth; "
                "separate several with commas)"
            )
    oauth = str(values.get("auth") or "")
    if not basic_auth and not oauth and not unsafe_no_auth:
        raise ConfigError(
            "Flower refuses to start without authentication: it shows every job's arguments "
            "and results and can revoke tasks and shut workers down. Set "
            f"{AUTH_SETTING}=user:password (or Flower's FLOWER_BASIC_AUTH / --basic-auth, or "
            f"its OAuth --auth), or {OPT_OUT_SETTING}=1 for a machine nobody else can reach."
        )
    parts = [_describe_auth(basic_auth, oauth)]
    save_ms = int(values.get("state_save_interval") or 0)
    if save_ms < 0:
        raise ConfigError(f"Flower's state save interval must be >= 0, got {save_ms} ms")
    if values.get("persistent"):
        parts.append(_describe_state(str(values.get("db") or ""), save_ms))
    else:
        parts.append("state in memory only (lost at restart)")
    if values.get("enable_events"):
        parts.append("asks the workers for task events every 5 s (enable_events)")
    else:
        parts.append(
            "does not ask the workers for task events (they send them if JOBS_TASK_EVENTS=on)"
        )
    return "; ".join(parts)


def _describe_auth(basic_auth: list[str], oauth: str) -> str:
    if basic_auth:
        users = ", ".join(str(entry).partition(":")[0] for entry in basic_auth)
        return f"basic auth for {users} (password hidden)"
    if oauth:
        return f"OAuth for {oauth!r}"
    return f"NO AUTHENTICATION ({OPT_OUT_SETTING})"


def _describe_state(db: str, save_ms: int) -> str:
    if not db:
        raise ConfigError("Flower's persistent mode needs a state file (JOBS_FLOWER_DB)")
    path = Path(db).absolute()
    # Checked now: Flower itself would only fail at its first save, at shutdown at worst,
    # and lose the state it was meant to keep.
    if not path.parent.is_dir():
        raise ConfigError(f"Flower's state file {path}: directory {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise ConfigError(f"Flower's state file {path}: directory {path.parent} is not writable")
    when = f"every {save_ms / 1000:g} s and at shutdown" if save_ms else "at shutdown"
    return f"state in {path} (saved {when})"


def install(app: Any) -> None:
    """Give ``celery -A APP flower`` the platform's defaults and checks (see the module doc).

    ``app`` is an app made by ``create_app`` (its ``jobs_settings`` are read).
    """
    from celery import signals

    def check(sender: Any = None, **_: Any) -> Exception | None:
        if _running(COMMAND):
            return _check_started_flower(app.jobs_settings)
        return None

    # Connected in every process (receivers are cheap); it acts only inside `flower`.
    signals.import_modules.connect(check, sender=app, weak=False)
    if _running(COMMAND):
        _apply_defaults(flower_options(app.jobs_settings))


def _running(command: str) -> bool:
    """Whether this process is running the ``celery`` subcommand ``command``: while the app
    loads, the ``celery`` group's context names the subcommand it is about to invoke; inside
    the subcommand, its own context is current."""
    import click

    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if command in (ctx.invoked_subcommand, ctx.info_name):
            return True
        ctx = ctx.parent
    return False


def _apply_defaults(values: Mapping[str, Any]) -> None:
    from flower.options import default_options

    for name, value in values.items():
        # Option values, not defaults: Flower's env, config file and flags set them again.
        setattr(default_options, name, value)


def _check_started_flower(settings: Settings) -> Exception | None:
    import click
    from flower.options import default_options

    try:
        summary = check_options(
            default_options.as_dict(), unsafe_no_auth=settings.flower_unsafe_no_auth
        )
    except ConfigError as exc:
        # Returned, not raised: Celery's loader raises an exception that an import_modules
        # receiver returns (a raised one it would also log with a traceback first); click
        # shows it as "Error: ..." and exits 1, before Flower binds its port.
        return click.ClickException(str(exc))
    level = logging.WARNING if "NO AUTHENTICATION" in summary else logging.INFO
    logger.log(level, "Flower: %s", summary, extra={"event": "jobs.flower.config"})
    return None
