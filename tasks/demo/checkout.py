"""The tour's checkout step: an order and its charge committed together (``delay_on_commit``).

Two producer processes run the reference checkout (:mod:`tasks.checkout`): one rolls its
order back after the charge was dispatched, one commits and SIGKILLs itself right after
the commit. The first must leave no job at all; the second's charge must be published by
a worker's relay, with the task id the producer printed, and charge once. :func:`run`
places them (during the tour, so the drain waits for the charge too), :func:`settle`
reads what they came to, :func:`report` prints the section and its expectations.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import Any

import sqlalchemy as sa
from rich.table import Table

from jobs_platform.clock import as_utc
from jobs_platform.outbox.model import job_outbox
from jobs_platform.testing import wait_for
from tasks import billing

AMOUNT_CENTS = 4990


@dataclasses.dataclass
class Checkout:
    #: What each producer printed: order_id, invoice_id, charge_task_id, committed.
    abandoned: dict[str, Any]
    placed: dict[str, Any]
    #: The committed producer's exit status (-9: SIGKILLed, as intended).
    producer_exit: int
    #: Seconds from the call that wrote the committed row to a relay's publish (None: not
    #: published). The rolled-back order's ids may be the committed one's: SQLite reuses a
    #: rolled-back row's id, so the report names the rolled-back order by its charge only.
    relayed_after_s: float | None = None
    #: Whether the rolled-back order's charge ever had an outbox row.
    abandoned_in_outbox: bool = False
    #: The committed order's invoice status at the end.
    invoice_status: str = "?"


def _producer(facts: Any, *flags: str) -> tuple[int, dict[str, Any]]:
    argv = ["-m", "tasks.checkout", "--email", "grace@example.com", "--amount", str(AMOUNT_CENTS)]
    done = subprocess.run(
        [sys.executable, *argv, *flags],
        env=facts.stack.env,
        cwd=facts.demo_dir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"the checkout producer printed nothing: {done.stderr[-2000:]}")
    return done.returncode, json.loads(lines[-1])


def _outbox_row(task_id: str) -> Any:
    with billing.billing_engine().connect() as conn:
        return conn.execute(sa.select(job_outbox).where(job_outbox.c.task_id == task_id)).first()


def run(facts: Any, view: Any) -> Checkout:
    """Place the two orders; wait until a relay has published the committed one's charge."""
    _, abandoned = _producer(facts, "--abandon")
    view.say("checkout: an order rolled back after dispatching its charge (delay_on_commit)")
    code, placed = _producer(facts, "--kill-after-commit")
    view.say(
        f"checkout: order {placed['order_id']} committed with its charge; the producer "
        f"SIGKILLed itself right after the commit (exit {code})"
    )
    step = Checkout(abandoned, placed, code)
    with_row = wait_for(
        lambda: (
            (row := _outbox_row(placed["charge_task_id"])) is not None
            and row.published_at is not None
            and row
        ),
        timeout_s=60,  # a relay pass every 0.2 s; the slack is the machine's load
        interval_s=0.1,
        message="a worker's relay to publish the committed charge",
    )
    step.relayed_after_s = (
        as_utc(with_row.published_at) - as_utc(with_row.created_at)
    ).total_seconds()
    return step


def settle(facts: Any) -> None:
    """What the two orders came to (after the tour drained every job)."""
    step: Checkout | None = facts.checkout
    if step is None:
        return
    step.abandoned_in_outbox = _outbox_row(step.abandoned["charge_task_id"]) is not None
    invoice = billing.load_invoice(billing.billing_engine(), step.placed["invoice_id"])
    step.invoice_status = str((invoice or {}).get("status", "missing"))


def report(rep: Any) -> None:
    """Section 4b of the report, with its two expectations."""
    facts = rep.facts
    step: Checkout | None = facts.checkout
    rep.console.print()
    rep.console.rule("[bold]4b. An order and its charge in one transaction (delay_on_commit)")
    if step is None:
        rep.expect("a rolled-back order never charged", False, "the checkout step did not run")
        return
    abandoned, placed = step.abandoned, step.placed
    lost_id, charge_id = abandoned["charge_task_id"], placed["charge_task_id"]
    reference = f"invoice-{placed['invoice_id']}"
    charges = sum(1 for c in facts.charges if c.get("reference") == reference)
    ran = facts.states.get(charge_id, "not seen")
    lost_seen = lost_id in facts.tracks
    relayed = "never" if step.relayed_after_s is None else f"{step.relayed_after_s:.2f} s"
    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("seen")
    table.add_row(
        "an order rolled back after its charge was dispatched",
        f"charge {lost_id[:8]}: "
        + ("[bold red]in the outbox[/]" if step.abandoned_in_outbox else "no outbox row")
        + (", [bold red]sent[/]" if lost_seen else ", never sent"),
    )
    table.add_row(
        f"order {placed['order_id']}: committed, producer SIGKILLed right after the commit",
        f"exit {step.producer_exit}; charge {charge_id[:8]} published by a relay "
        f"{relayed} after the call, {ran}",
    )
    table.add_row(
        f"  invoice {placed['invoice_id']} at the gateway",
        f"{step.invoice_status}, [bold]{charges}[/] charge(s)",
    )
    rep.console.print(table)
    rep.console.print(
        "The charge is a row of the platform's outbox written in the order's transaction: "
        "the rollback took it with the order, and the commit made it durable before the "
        "producer died. Every worker's relay publishes committed rows with the task id the "
        "call returned (docs/outbox.md)."
    )
    rep.expect(
        "a rolled-back order never charged",
        not step.abandoned_in_outbox and not lost_seen,
        ("an outbox row" if step.abandoned_in_outbox else "no outbox row")
        + (", its charge sent" if lost_seen else ", no job"),
    )
    rep.expect(
        "a committed order charged once though its producer was SIGKILLed",
        step.producer_exit == -9 and step.invoice_status == "paid" and charges == 1,
        f"exit {step.producer_exit}, invoice {step.invoice_status}, {charges} charge(s), "
        f"relayed after {relayed}",
    )
