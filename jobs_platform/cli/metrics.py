"""``celery -A APP metrics``: serve Prometheus metrics (docs/metrics.md)."""

from __future__ import annotations

import click

from jobs_platform.urls import masked


@click.command("metrics")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=9808, show_default=True, help="TCP port."
)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on (0.0.0.0 in a container that Prometheus scrapes from outside).",
)
@click.option("--once", is_flag=True, help="Print one scrape on stdout and exit.")
@click.pass_context
def metrics(ctx: click.Context, port: int, host: str, once: bool) -> None:
    """Serve /metrics: queue depths and ages, in-flight jobs, task outcomes counted by the
    workers, dead letters, the delayed store, beat's ticks.

    Needs no task events. Reads the broker, the coordination Redis and JOBS_DATABASE_URL
    at every scrape.
    """
    # Imported here: every `celery` invocation loads this module to list its commands.
    from jobs_platform.exporter import server as exporter

    app = ctx.obj.app
    if once:
        click.echo(exporter.exposition(app), nl=False)
        return
    try:
        server = exporter.serve(app, host=host, port=port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
    click.echo(
        f"serving http://{host}:{port}/metrics (broker {masked(str(app.conf.broker_url))}, "
        f"database {masked(app.jobs_settings.database_url)})",
        err=True,
    )
    exporter.run_until_stopped(server)
