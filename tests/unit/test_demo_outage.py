"""The tour's partner outage: the fake partner's outage switch and the report's section 8d,
which says what the circuit breaker did and judges it. Pure: a partner on loopback, hand-made
facts, no broker."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console

from tasks import partner as partner_tasks
from tasks.demo import outage
from tasks.demo.report import Report
from tasks.fake_partner import FakePartner, Shipment
from tests.unit.test_demo_report import facts

JOBS = [f"job-{n:02d}" for n in range(20)]


def call(partner: FakePartner, order: int, key: str) -> int:
    request = urllib.request.Request(
        f"{partner.url}/shipments/{order}",
        data=json.dumps({"order_id": order}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": key},
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_partner_answers_503_to_every_shipment_during_an_outage_and_records_each() -> None:
    with FakePartner() as partner:
        assert call(partner, 1, "a") == 200
        partner.outage(30)
        assert [call(partner, 2, "b"), call(partner, 3, "c")] == [503, 503]
        partner.outage(0)
        assert call(partner, 2, "b") == 200
        assert [(s.order, s.key, s.status) for s in partner.shipments] == [
            (1, "a", 200),
            (2, "b", 503),
            (3, "c", 503),
            (2, "b", 200),
        ]
        assert partner.requests == []  # the accounts' record is the accounts'


def test_the_shipment_task_names_its_downstream_and_a_breaker_fit_for_the_demo() -> None:
    task = partner_tasks.book_shipment
    assert task.queue == "thirdparty"
    breaker = task.spec.breaker
    assert breaker is not None
    assert (breaker.key, breaker.threshold, breaker.window_s, breaker.cooldown_s) == (
        "shipping-partner",
        3,
        10.0,
        2.0,
    )


def step(**fields: Any) -> outage.Outage:
    """An outage as the short tour saw it: down at 100 s for 3 s, opened after 3 failures,
    one failed probe at 102.5 s, the closing one at 104.5 s, then the other 19 jobs."""
    calls = [Shipment(70_001 + n, JOBS[n], 503, 100.05 * (1 + n / 10_000)) for n in range(3)]
    calls.append(Shipment(70_010, JOBS[9], 503, 102.5))
    calls += [Shipment(70_001 + n, job, 200, 104.5 + n / 100) for n, job in enumerate(JOBS)]
    values: dict[str, Any] = {
        "opened_at": 100.1,
        "closed_at": 104.5,
        "opens": 2,
        "state": "closed",
        "deferred": 59.0,
        "calls": calls,
        "dead_letters": 0,
        "states": Counter({"SUCCESS": 20}),
    }
    values.update(fields)
    return outage.Outage(
        "shipping-partner",
        3,
        10.0,
        2.0,
        list(JOBS),
        99.9,
        down_at=100.0,
        up_at=103.0,
        spread_s=1.0,
        **values,
    )


def printed(tmp_path: Path, the_step: outage.Outage | None) -> tuple[str, Report]:
    console = Console(record=True, width=240, color_system=None)
    report = Report(console, facts(tmp_path, outage=the_step))
    outage.report(report)
    return " ".join(console.export_text().split()), report


def test_the_section_says_what_the_breaker_did_and_its_expectations_hold(tmp_path: Path) -> None:
    text, report = printed(tmp_path, step())
    assert "8d. A partner outage absorbed by the circuit breaker" in text
    assert (
        "the breaker │ shipping-partner (tasks.partner.book_shipment, thirdparty): threshold 3 "
        "failures in a row inside 10 s; open 2 s, then a probe"
    ) in text
    assert "every call answered 503 for 3.0 s; 20 shipments booked over its first 1 s" in text
    assert "it opened │ 0.1 s into the outage, after 3 failed call(s) (threshold 3)" in text
    assert (
        "while open or probing │ 59 deferrals (jobs_breaker_deferred_total): no attempt spent; "
        "1 call(s) reached the partner"
    ) in text
    assert (
        "probes │ 1 failed (open again for 2 s each); 1 succeeded and closed it 4.5 s into the "
        "outage, 1.5 s after the partner came back"
    ) in text
    assert "dead letters from this step │ 0" in text
    assert "jobs run once │ 20 of 20 (successful calls per Idempotency-Key at the partner: " in text
    assert "0 twice, 0 never); results: 20 SUCCESS" in text
    assert "calls at the partner │ 24: 4 failed, 20 succeeded" in text
    assert [(c.what, c.ok) for c in report.checks] == [
        ("the breaker opened and no job was dead-lettered while the partner was down", True),
        ("every job of the outage ran once after the partner came back", True),
    ]
    assert report.checks[0].detail == (
        "opened 0.1 s into the outage after 3 failed calls; 59 deferrals; 0 dead letters"
    )
    assert report.checks[1].detail == (
        "20 of 20 ran once (0 twice, 0 never); closed by a probe: yes"
    )


def test_a_dead_letter_or_a_breaker_that_never_opened_fails_the_first_expectation(
    tmp_path: Path,
) -> None:
    _, report = printed(tmp_path, step(dead_letters=2))
    assert [c.ok for c in report.checks] == [False, True]
    assert report.checks[0].detail.endswith("; 2 dead letters")
    _, report = printed(tmp_path, step(opened_at=None, opens=0, deferred=0.0))
    assert not report.checks[0].ok
    assert report.checks[0].detail.startswith("opened never after ")


def test_a_job_run_twice_or_never_or_a_breaker_left_open_fails_the_second(
    tmp_path: Path,
) -> None:
    twice = step()
    twice.calls.append(Shipment(70_001, JOBS[0], 200, 106.0))
    _, report = printed(tmp_path, twice)
    assert [c.ok for c in report.checks] == [True, False]
    assert report.checks[1].detail.startswith("19 of 20 ran once (1 twice, 0 never)")

    never = step(calls=[c for c in step().calls if c.key != JOBS[5] or c.status != 200])
    text, report = printed(tmp_path, never)
    assert not report.checks[1].ok
    assert (
        "19 of 20 (successful calls per Idempotency-Key at the partner: 0 twice, 1 never)" in text
    )

    text, report = printed(tmp_path, step(state="open", closed_at=None))
    assert not report.checks[1].ok
    assert "none closed it (state open)" in text
    assert report.checks[1].detail.endswith("closed by a probe: no")


def test_a_success_during_the_outage_fails_the_second_expectation(tmp_path: Path) -> None:
    early = step()
    early.calls[-1] = Shipment(70_020, JOBS[-1], 200, 101.0)  # before the partner came back
    _, report = printed(tmp_path, early)
    assert not report.checks[1].ok


def test_no_outage_step_is_a_failed_expectation(tmp_path: Path) -> None:
    text, report = printed(tmp_path, None)
    assert "8d. A partner outage absorbed by the circuit breaker" in text
    assert [(c.what, c.ok, c.detail) for c in report.checks] == [
        (
            "the breaker opened and no job was dead-lettered while the partner was down",
            False,
            "no outage step",
        )
    ]
