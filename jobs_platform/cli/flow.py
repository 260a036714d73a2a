"""``celery -A APP flow list|show KEY [--json]``: the fleet's flow control as it stands.

``list`` prints one row per key: each concurrency key a job asked for lately (its limit,
running and waiting jobs), each rate key the app's tasks name (its rate, a pause in
force), each circuit breaker (its state, failures in a row inside its window, when it opened,
when a job may probe), each open debounce window (its run's id, dispatches collapsed, when
it is due) and each fairness key with jobs waiting on a queue (its backlog and place in the
rotation, read from the broker). ``show KEY`` prints everything about one key: the jobs
holding its slots, those waiting (oldest first), its rate pause, its breaker, its open
windows, its fair backlog per queue. ``--json`` prints JSON Lines on stdout (``show``: one
object). Exit codes: 0 done, 1 nothing known of the key or Redis did not answer, 2 usage
error.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import redis
from rich.console import Console

from jobs_platform import brokers, coordination
from jobs_platform.cli import render
from jobs_platform.cli.options import json_option
from jobs_platform.flow import state
from jobs_platform.flow.breaker import Reading


def _client(app: Any) -> Any:
    client = coordination.client(app)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise click.ClickException(f"cannot reach the coordination Redis: {exc}") from exc
    return client


def _declared_rates(app: Any) -> dict[str, list[tuple[str, str | None]]]:
    declared: dict[str, list[tuple[str, str | None]]] = {}
    for task in app.tasks.values():
        spec = getattr(task, "spec", None)
        if spec is not None and spec.rate_key:
            rate = None if spec.rate is None else str(spec.rate)
            declared.setdefault(spec.rate_key, []).append((str(task.name), rate))
    return declared


def _fair_keys(app: Any, *, only: str | None = None) -> list[dict[str, Any]]:
    queues = [queue.name for queue in app.conf.task_queues or ()]
    try:
        found = brokers.of(app).fair_keys(app, queues)
    except redis.RedisError as exc:
        raise click.ClickException(f"cannot reach the broker: {exc}") from exc
    return [dataclasses.asdict(f) for f in found if only is None or f.key == only]


def _rows(app: Any, client: Any) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for conc in state.concurrency_keys(client):
        rows.append(
            {
                "kind": "concurrency",
                "key": conc.key,
                "limit": conc.limit,
                "running": len(conc.running),
                "waiting": len(conc.waiting),
            }
        )
    for rate in state.rate_keys(client, _declared_rates(app)):
        rows.append(
            {
                "kind": "rate",
                "key": rate.key,
                "limit": ", ".join(rate.rates) or None,
                "tasks": rate.tasks,
                "paused_for_s": rate.paused_for_s,
            }
        )
    for reading in state.breakers(client, state.declared_breakers(app)):
        rows.append(_breaker_row(reading))
    for window in state.windows(client):
        rows.append({"kind": "debounce", **dataclasses.asdict(window)})
    for found in _fair_keys(app):
        rows.append({"kind": "fairness", **found, "waiting": found["backlog"]})
    return rows


def _breaker_row(reading: Reading) -> dict[str, Any]:
    return {
        "kind": "breaker",
        **dataclasses.asdict(reading),
        "limit": None if reading.threshold is None else f"{reading.threshold} failures",
    }


def breaker_text(row: dict[str, Any]) -> str:
    """One line of a breaker: its state, failures, when it opened, when a job may probe."""
    state_name = str(row["state"]).replace("_", "-")
    if row["state"] == "closed":
        window = f" in {row['window_s']:g} s" if row["window_s"] else ""
        of = f" of {row['threshold']}" if row["threshold"] else ""
        return f"closed, {row['failures']}{of} failures in a row{window}"
    opened = f", opened at {_clock(row['opened_at'])}" if row["opened_at"] else ""
    if row["state"] == "open":
        probe = row["next_probe_in_s"]
        return f"{state_name}{opened}, next probe in {probe:.1f} s"
    who = f"probe {row['probe']} running" if row["probe"] else "waiting for a probe"
    return f"{state_name}{opened}, {who}"


def _clock(unix: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _state_text(row: dict[str, Any]) -> str:
    if row["kind"] == "breaker":
        return breaker_text(row)
    if row["kind"] == "rate":
        return f"paused {row['paused_for_s']:.1f} s" if row["paused_for_s"] else "-"
    if row["kind"] == "fairness":
        return f"queue {row['queue']}, next in rotation: {row['position']}"
    if row["kind"] == "debounce":
        return (
            f"{row['task']}: run {row['run_id']} due in {row['due_in_s']:.1f} s, "
            f"{row['dispatches']} dispatch(es)"
        )
    return "-"


@click.group(
    help="Flow control: concurrency keys, rate keys, breakers, debounce windows, fairness."
)
def flow() -> None:
    """The ``flow`` commands."""


@flow.command("list")
@json_option
@click.pass_context
def list_(ctx: click.Context, as_json: bool) -> None:
    """One row per key: limit, running, waiting, state."""
    app = ctx.obj.app
    rows = _rows(app, _client(app))
    if as_json:
        render.emit_json(rows)
        return
    out = render.table(
        "flow control",
        ["kind", "key", "limit", "running", "waiting"],
        ["state"],
        right=["running", "waiting"],
    )
    for row in rows:
        out.add_row(
            *render.cells(
                [
                    row["kind"],
                    row["key"],
                    "-" if row.get("limit") is None else row["limit"],
                    row.get("running", "-"),
                    row.get("waiting", "-"),
                    _state_text(row),
                ]
            )
        )
    render.print_table(Console(), out)


def _shown(app: Any, client: Any, key: str) -> dict[str, Any] | None:
    found = state.concurrency_keys(client, only=key)
    conc = found[0] if found else None
    rates = state.rate_keys(client, {k: v for k, v in _declared_rates(app).items() if k == key})
    windows = state.windows(client, only=key)
    fair = _fair_keys(app, only=key)
    breakers = state.breakers(client, state.declared_breakers(app), only=key)
    if conc is None and not rates and not windows and not fair and not breakers:
        return None
    return {
        "key": key,
        "concurrency": None if conc is None else dataclasses.asdict(conc),
        "rate": dataclasses.asdict(rates[0]) if rates else None,
        "breaker": _breaker_row(breakers[0]) if breakers else None,
        "debounce": [dataclasses.asdict(w) for w in windows],
        "fairness": [{k: v for k, v in f.items() if k != "key"} for f in fair],
    }


@flow.command("show")
@click.argument("key")
@json_option
@click.pass_context
def show(ctx: click.Context, key: str, as_json: bool) -> None:
    """Everything about KEY: slot holders, waiters (oldest first), rate pause, breaker,
    windows."""
    app = ctx.obj.app
    shown = _shown(app, _client(app), key)
    if shown is None:
        click.echo(f"nothing is known of flow key {key!r}", err=True)
        ctx.exit(1)
    assert shown is not None
    if as_json:
        render.emit_json([shown])
        return
    echo = click.echo
    conc = shown["concurrency"]
    if conc is not None:
        echo(
            f"concurrency: limit {conc['limit']}, {len(conc['running'])} running, "
            f"{len(conc['waiting'])} waiting"
        )
        for holder in conc["running"]:
            echo(f"  running {holder['task_id']} (lease {holder['lease_left_s']:.1f} s left)")
        for waiter in conc["waiting"]:
            echo(f"  waiting {waiter['task_id']} for {waiter['waiting_s']:.1f} s")
    rate = shown["rate"]
    if rate is not None:
        paused = f", paused {rate['paused_for_s']:.1f} s" if rate["paused_for_s"] else ""
        echo(
            f"rate: {', '.join(rate['rates']) or 'no rate (pauses only)'} for "
            f"{', '.join(rate['tasks'])}{paused}"
        )
    if shown["breaker"] is not None:
        echo(f"breaker: {breaker_text(shown['breaker'])}")
        row = shown["breaker"]
        if row["threshold"]:
            echo(
                f"  opens after {row['threshold']} failures in a row within "
                f"{row['window_s']:g} s; cool-down {row['cooldown_s']:g} s; opened "
                f"{row['opens']} time(s)"
            )
    for found in shown["fairness"]:
        echo(
            f"fairness (queue {found['queue']}): {found['backlog']} waiting, "
            f"{found['position']} key(s) ahead in the rotation"
        )
    for window in shown["debounce"]:
        echo(
            f"debounce ({window['task']}): run {window['run_id']} due in "
            f"{window['due_in_s']:.1f} s, {window['dispatches']} dispatch(es), open "
            f"{window['open_for_s']:.1f} s"
        )
