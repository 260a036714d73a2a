"""``celery -A APP versions lock|check [--file jobs.lock.json]``: the payload versions lock.

``lock`` writes every ReliableTask's name, version and signature to the lock file (commit
it). ``check`` compares the code with it and exits 1, saying what changed, when a signature
changed and the version did not, a version went down, an upcaster is missing for a bumped
version, or a locked task is gone; safe changes (a new task, a bump with its upcasters) are
printed as notes and pass. Exit codes: 0 passes, 1 fails, 2 usage error (no lock file).
"""

from __future__ import annotations

from typing import Any

import click

from jobs_platform import lockfile

_file = click.option(
    "--file",
    "path",
    default=lockfile.DEFAULT_PATH,
    show_default=True,
    help="The lock file.",
)


@click.group(help="The payload versions lock file (docs/deploys.md).")
def versions() -> None:
    pass


@versions.command(help="Write every task's name, version and signature to the lock file.")
@_file
@click.pass_context
def lock(ctx: click.Context, path: str) -> None:
    found = lockfile.entries(_app(ctx))
    lockfile.write(path, found)
    click.echo(f"locked {len(found)} tasks in {path}")


@versions.command(help="Fail (exit 1) on a task change queued jobs would not survive.")
@_file
@click.pass_context
def check(ctx: click.Context, path: str) -> None:
    try:
        locked = lockfile.read(path)
    except FileNotFoundError:
        raise click.UsageError(f"no lock file {path}: write it with `versions lock`") from None
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    report = lockfile.compare(locked, lockfile.entries(_app(ctx)))
    for note in report.notes:
        click.echo(f"note: {note}")
    for problem in report.problems:
        click.echo(f"FAIL: {problem}", err=True)
    if report.problems:
        raise SystemExit(1)
    click.echo(f"{path}: {len(locked)} tasks locked, no unversioned change")


def _app(ctx: click.Context) -> Any:
    return ctx.obj.app
