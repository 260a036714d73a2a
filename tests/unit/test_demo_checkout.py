"""The demo's checkout section reads well and judges what it saw. Pure: hand-made facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from tasks.demo import checkout
from tasks.demo.observe import Track
from tasks.demo.report import Report
from tests.unit.test_demo_report import facts

ABANDONED = {"order_id": 3, "invoice_id": 7, "charge_task_id": "aaaa1111-x", "committed": False}
PLACED = {"order_id": 4, "invoice_id": 8, "charge_task_id": "bbbb2222-y", "committed": True}


def printed(tmp_path: Path, step: checkout.Checkout, **fields: Any) -> tuple[str, Report]:
    console = Console(record=True, width=240, color_system=None)
    report = Report(console, facts(tmp_path, checkout=step, **fields))
    checkout.report(report)
    return " ".join(console.export_text().split()), report


def test_the_section_says_what_happened_and_both_expectations_hold(tmp_path: Path) -> None:
    step = checkout.Checkout(ABANDONED, PLACED, -9, relayed_after_s=0.14, invoice_status="paid")
    text, report = printed(
        tmp_path,
        step,
        charges=[{"reference": "invoice-8"}, {"reference": "invoice-9"}],
        tracks={"bbbb2222-y": Track()},
        states={"bbbb2222-y": "SUCCESS"},
    )
    assert "an order rolled back after its charge was dispatched" in text
    assert "charge aaaa1111: no outbox row, never sent" in text
    assert "exit -9; charge bbbb2222 published by a relay 0.14 s after the call, SUCCESS" in text
    assert "invoice 8 at the gateway │ paid, 1 charge(s)" in text
    assert [(c.what, c.ok) for c in report.checks] == [
        ("a rolled-back order never charged", True),
        ("a committed order charged once though its producer was SIGKILLed", True),
    ]


def test_a_charge_twice_or_a_rolled_back_job_fails_the_expectations(tmp_path: Path) -> None:
    step = checkout.Checkout(
        ABANDONED, PLACED, -9, relayed_after_s=0.1, abandoned_in_outbox=True, invoice_status="paid"
    )
    _, report = printed(
        tmp_path,
        step,
        charges=[{"reference": "invoice-8"}, {"reference": "invoice-8"}],
        tracks={"aaaa1111-x": Track()},
    )
    assert [c.ok for c in report.checks] == [False, False]
    assert report.checks[1].detail.startswith("exit -9, invoice paid, 2 charge(s)")


def test_no_step_is_a_failed_expectation(tmp_path: Path) -> None:
    console = Console(record=True, width=240, color_system=None)
    report = Report(console, facts(tmp_path))
    checkout.report(report)
    assert [c.ok for c in report.checks] == [False]
