"""``celery -A APP health [--queue Q] [--check NAME] [--json] [--timeout S]``.

Exit 0 only when every selected check passes, 1 otherwise (2: usage error). One line per
check, ``ok``/``WARN``/``FAIL name: detail`` (a WARN passes: an open circuit breaker), and
a summary line; ``--json`` prints one object with
every check instead. Never a traceback: usable as a container health check as is
(docs/health.md has one per service).
"""

from __future__ import annotations

import json
import time

import click

from jobs_platform.health.checks import Check, describe_error, one_line
from jobs_platform.health.runner import CHECKS, run
from jobs_platform.routing import QUEUE_NAMES


@click.command("health")
@click.option(
    "--queue",
    "-Q",
    "queues",
    multiple=True,
    type=click.Choice(QUEUE_NAMES),
    help="Check only this queue (repeatable; default: all). Restricts consumers, canary "
    "and backlog: a worker container checks its own queue.",
)
@click.option(
    "--check",
    "selected",
    multiple=True,
    type=click.Choice(CHECKS),
    help="Run only this check (repeatable; default: all).",
)
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Seconds the whole run may take (the canary gets most of it).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every check.")
@click.pass_context
def health(
    ctx: click.Context,
    queues: tuple[str, ...],
    selected: tuple[str, ...],
    timeout: float,
    as_json: bool,
) -> None:
    """Exit 0 if the platform is healthy, else 1 with one line per failing check.

    \b
    broker     Redis answers PING
    database   the platform's database answers SELECT 1
    consumers  every queue has a worker consuming it
    canary     a canary job sent to each queue comes back (catches a worker that
               is alive but not consuming; a busy queue passes)
    beat       beat has ticked recently (when the app has a beat schedule)
    spool      no dead letter is stuck in the spool (database writes failing)
    backlog    each queue's oldest waiting job is younger than its objective
    breakers   every circuit breaker closed (an open one is a WARN line, exit 0)
    """
    app = ctx.obj.app
    if getattr(app, "jobs_settings", None) is None:
        raise click.UsageError("health checks apps made by jobs_platform.create_app()")
    start = time.monotonic()
    chosen_queues = [q for q in QUEUE_NAMES if not queues or q in queues]
    chosen = [c for c in CHECKS if not selected or c in selected]
    try:
        results = run(app, queues=chosen_queues, selected=chosen, timeout_s=timeout)
    except Exception as exc:  # a bug, not a verdict: still one line
        results = [Check("health", False, one_line(describe_error(exc)))]
    elapsed = time.monotonic() - start
    healthy = all(check.ok for check in results)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": healthy,
                    "elapsed_s": round(elapsed, 3),
                    "timeout_s": timeout,
                    "queues": chosen_queues,
                    "checks": [check.as_json() for check in results],
                }
            )
        )
    else:
        for check in results:
            label = "FAIL" if not check.ok else "WARN" if check.warn else "ok"
            click.echo(f"{label:<4} {check.name}: {check.detail}")
        failed = sum(not check.ok for check in results)
        warned = sum(check.ok and check.warn for check in results)
        if healthy:
            also = f" ({warned} with a warning)" if warned else ""
            click.echo(f"healthy: {len(results)} checks passed{also} in {elapsed:.2f} s")
        else:
            click.echo(f"UNHEALTHY: {failed} of {len(results)} checks failed ({elapsed:.2f} s)")
    ctx.exit(0 if healthy else 1)
