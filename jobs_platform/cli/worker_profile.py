"""``celery -A APP worker-profile QUEUE``: start (or print) the worker for a queue's profile."""

from __future__ import annotations

import os
import shlex
import sys

import click

from jobs_platform.profiles import PROFILES, worker_argv


def app_argument(ctx: click.Context) -> str:
    """The ``-A``/``--app`` value as the user typed it (``myproj.jobs``).

    The worker is a new process that must import the app the same way; the name given to
    ``create_app()`` is only a label and usually not an importable module.
    """
    value = ctx.find_root().params.get("app")
    if isinstance(value, str) and value:
        return value
    raise click.UsageError(
        "worker-profile needs the app: celery -A myproj.jobs worker-profile QUEUE"
    )


@click.command(
    "worker-profile",
    context_settings={"ignore_unknown_options": True},
)
@click.argument("queue", type=click.Choice(sorted(PROFILES)))
@click.option(
    "--print", "print_only", is_flag=True, help="Print the command instead of running it."
)
@click.option("--hostname", "-n", default=None, help="Worker node name (default QUEUE@%h).")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    default=None,
    help="Pool processes (default: the profile's; heavy: the CPUs this container may use).",
)
@click.argument("worker_options", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def worker_profile(
    ctx: click.Context,
    queue: str,
    print_only: bool,
    hostname: str | None,
    loglevel: str,
    concurrency: int | None,
    worker_options: tuple[str, ...],
) -> None:
    """Run a worker with QUEUE's profile (pool, concurrency, prefetch, recycling).

    Options after QUEUE that are not listed here go to `celery worker` unchanged, e.g.
    `celery -A myproj.jobs worker-profile heavy -c 2 --max-memory-per-child 500000`.
    """
    try:
        argv = worker_argv(
            app_argument(ctx),
            queue,
            hostname=hostname,
            loglevel=loglevel,
            concurrency=concurrency,
            extra=worker_options,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if print_only:
        click.echo(shlex.join(argv))
        return
    # Replace this process so signals (TERM/QUIT/KILL) reach the worker directly.
    os.execv(sys.executable, [sys.executable, "-m", *argv])
