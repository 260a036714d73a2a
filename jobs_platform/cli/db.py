"""``celery -A APP db ...``: the platform's migrations on ``JOBS_DATABASE_URL``.

The platform's revision lives in its own version table (``jobs_platform_alembic_version``);
``alembic_version`` is left to the app's own Alembic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from jobs_platform import db as platform_db
from jobs_platform.errors import ConfigError
from jobs_platform.urls import masked

T = TypeVar("T")


@click.group("db")
def db() -> None:
    """The platform's own tables (dead letters, idempotency keys)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.pass_context
def upgrade(ctx: click.Context, revision: str) -> None:
    """Apply migrations up to REVISION."""
    url = _url(ctx)
    moved = _clear(lambda: platform_db.upgrade(url, revision))
    if moved is not None:
        click.echo(str(moved))
    click.echo(
        f"database at {masked(url)} is at revision {platform_db.current(url) or '(none)'} "
        f"(in {platform_db.VERSION_TABLE})"
    )


@db.command("current")
@click.pass_context
def current(ctx: click.Context) -> None:
    """Print the platform's applied revision."""
    url = _url(ctx)
    revision = platform_db.current(url)
    if revision is None:
        legacy = _clear(lambda: platform_db.legacy_revision(url))
        if legacy is not None:
            revision = (
                f"{legacy} (recorded in {platform_db.LEGACY_VERSION_TABLE} by an older release: "
                f"`celery -A APP db upgrade` moves it to {platform_db.VERSION_TABLE})"
            )
    click.echo(revision or "(none)")


@db.command("stamp")
@click.argument("revision")
@click.pass_context
def stamp(ctx: click.Context, revision: str) -> None:
    """Record REVISION as applied without running migrations (repairs a lost version row)."""
    url = _url(ctx)
    _clear(lambda: platform_db.stamp(url, revision))
    click.echo(f"database at {masked(url)} is stamped at revision {platform_db.current(url)}")


def _url(ctx: click.Context) -> str:
    return str(ctx.obj.app.jobs_settings.database_url)


def _clear(action: Callable[[], T]) -> T:
    """Run ``action``; an ambiguous version state or an unknown revision is a plain error
    message, not a traceback."""
    from alembic.util import CommandError

    try:
        return action()
    except (ConfigError, CommandError) as exc:
        raise click.ClickException(str(exc)) from exc
