"""``celery -A APP db upgrade``: apply the platform's migrations to ``JOBS_DATABASE_URL``."""

from __future__ import annotations

from typing import Any

import click
import sqlalchemy as sa

from jobs_platform import db as platform_db


@click.group("db")
def db() -> None:
    """The platform's own tables (dead letters, idempotency keys)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.pass_context
def upgrade(ctx: click.Context, revision: str) -> None:
    """Apply migrations up to REVISION."""
    app: Any = ctx.obj.app
    url = app.jobs_settings.database_url
    platform_db.upgrade(url, revision)
    click.echo(f"database at {_shown(url)} is at revision {_current(url)}")


@db.command("current")
@click.pass_context
def current(ctx: click.Context) -> None:
    """Print the applied revision."""
    url = ctx.obj.app.jobs_settings.database_url
    click.echo(_current(url) or "(none)")


def _current(url: str) -> str | None:
    with platform_db.engine_for(url).connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return None
        value = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
    return None if value is None else str(value)


def _shown(url: str) -> str:
    return sa.engine.make_url(url).render_as_string(hide_password=True)
