"""``celery -A APP worker-profile QUEUE``: start (or print) the worker for a queue's profile."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Any

import click

from jobs_platform.profiles import PROFILES, worker_argv


@click.command("worker-profile")
@click.argument("queue", type=click.Choice(sorted(PROFILES)))
@click.option(
    "--print", "print_only", is_flag=True, help="Print the command instead of running it."
)
@click.option("--hostname", "-n", default=None, help="Worker node name (default QUEUE@%h).")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.pass_context
def worker_profile(
    ctx: click.Context, queue: str, print_only: bool, hostname: str | None, loglevel: str
) -> None:
    """Run a worker with QUEUE's profile (pool, concurrency, prefetch, recycling)."""
    app: Any = ctx.obj.app
    app_name = os.environ.get("JOBS_APP") or app.main
    argv = worker_argv(app_name, queue, hostname=hostname, loglevel=loglevel)
    if print_only:
        click.echo(shlex.join(argv))
        return
    # Replace this process so signals (TERM/QUIT/KILL) reach the worker directly.
    os.execv(sys.executable, [sys.executable, "-m", *argv])
