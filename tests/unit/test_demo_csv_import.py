"""The tour's CSV import: the app's file handling (tasks/imports.py) and the report's section
8c, which says what happened and judges it; the tour's other expectations leave the poison
chunk aside, and only it. Pure: files under tmp_path, hand-made facts, no service."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from jobs_platform import PermanentError
from tasks import imports
from tasks.demo import csv_import
from tasks.demo.observe import Track
from tasks.demo.report import Report
from tests.unit.test_demo_report import facts

BATCH = "107b5287-df94-4979-840c-d7644e3b0475"


@pytest.fixture()
def app_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("JOBS_APP_DATA", str(tmp_path / "appdata"))
    return tmp_path / "appdata"


def test_a_chunk_reads_its_rows_and_the_malformed_amount_is_a_permanent_error(
    app_data: Path,
) -> None:
    path = imports.write_file("orders-1.csv", 1_000, malformed=345)
    assert path == app_data / "imports" / "orders-1.csv"
    assert imports.count_rows(path) == 1_000
    rows = list(imports.read_rows(path, 300, 400))
    assert [n for n, _ in rows] == list(range(300, 400))
    parsed = imports.parse_row("orders-1.csv", *rows[0])
    assert parsed["row"] == 300 and parsed["amount_cents"] > 0
    with pytest.raises(imports.MalformedRow, match=r"row 345: amount '19,90' is not euros"):
        [imports.parse_row("orders-1.csv", n, f) for n, f in rows]
    assert issubclass(imports.MalformedRow, PermanentError)

    imports.fix_amount("orders-1.csv", 345, "19.90")
    [(number, fields)] = imports.read_rows(path, 345, 346)
    assert imports.parse_row("orders-1.csv", number, fields)["amount_cents"] == 1990
    assert imports.count_rows(path) == 1_000  # the other rows untouched
    assert list(imports.read_rows(path, 344, 345)) == rows[44:45]


def test_an_import_names_a_file_of_its_directory_only(app_data: Path) -> None:
    with pytest.raises(imports.MalformedRow):
        imports.import_path("../../etc/passwd")


def step(**fields: Any) -> csv_import.Import:
    settled = csv_import.Counts("failed", 10, 0, 9, 1, 0)
    final = csv_import.Counts("succeeded", 10, 0, 10, 0, 0)
    values: dict[str, Any] = {
        "settled_after_s": 0.4,
        "succeeded_after_s": 0.7,
        "at_settle": settled,
        "dead_task_id": "dddd4444-chunk",
        "dead_range": (2000, 2500),
        "dead_letter_id": 2,
        "dead_reason": "permanent",
        "dead_error": "MalformedRow: row 2345: amount '19,90' is not euros with a decimal point",
        "checkpoint": {"row": 2300},
        "replay_task_id": "eeee5555-replay",
        "replayed": {"start": 2000, "stop": 2500, "resumed_at": 2300, "rows": 200},
        "letter_after": "replayed",
        "final": final,
        "runs": Counter({"update_dashboard": 1, "reindex_search": 1}),
        "rows_seen": {"update_dashboard": 4800, "reindex_search": 5000},
        "rows_imported": 5000,
    }
    values.update(fields)
    return csv_import.Import("orders-1.csv", 5000, 2345, BATCH, 10, 100.0, **values)


def printed(tmp_path: Path, the_step: csv_import.Import, **fields: Any) -> tuple[str, Report]:
    console = Console(record=True, width=240, color_system=None)
    report = Report(console, facts(tmp_path, csv_import=the_step, **fields))
    csv_import.report(report)
    return " ".join(console.export_text().split()), report


def test_the_section_says_what_happened_and_its_expectations_hold(tmp_path: Path) -> None:
    text, report = printed(tmp_path, step())
    assert "8c. A 5,000-row CSV import as a batch of 500-row chunks" in text
    assert f"the batch │ {BATCH} (10 chunks of 500 rows of orders-1.csv, on heavy)" in text
    assert (
        "every chunk settled │ 0.4 s after the batch was sent: 10 members: 9 succeeded, 1 dead, "
        "0 cancelled, 0 pending (status failed)"
    ) in text
    assert "rows 2,000-2,499: dead letter #2, permanent, MalformedRow: row 2345" in text
    assert 'its checkpoint (in the letter) │ {"row": 2300}: rows 2,000-2,299 were in' in text
    assert "resumed at row 2,300, wrote 200 rows; the letter is now replayed" in text
    assert "10 members: 10 succeeded, 0 dead, 0 cancelled, 0 pending (status succeeded)" in text
    assert "it saw 4,800 rows (200 of the dead chunk's not in yet)" in text
    assert "rows imported │ 5,000 of the file's 5,000" in text
    assert f"To look again: celery -A tasks batch show {BATCH}, celery -A tasks dlq show 2" in text
    assert [(c.what, c.ok) for c in report.checks] == [
        ("the import's malformed row dead-lettered its chunk alone, with its checkpoint", True),
        ("the replayed chunk resumed at its checkpoint and the batch succeeded", True),
        ("the import's on_complete and on_success ran once each", True),
        ("rows imported = rows in the file", True),
    ]


def test_a_callback_twice_a_replay_from_row_one_or_a_row_missing_fails_its_expectation(
    tmp_path: Path,
) -> None:
    the_step = step(
        replayed={"resumed_at": 2000, "rows": 500},
        runs=Counter({"update_dashboard": 1, "reindex_search": 2}),
        rows_imported=4999,
    )
    _, report = printed(tmp_path, the_step)
    assert [c.ok for c in report.checks] == [True, False, False, False]
    assert report.checks[2].detail == "update_dashboard 1, reindex_search 2"


def test_two_dead_chunks_fail_the_first_expectation(tmp_path: Path) -> None:
    _, report = printed(tmp_path, step(at_settle=csv_import.Counts("failed", 10, 0, 8, 2, 0)))
    assert not report.checks[0].ok
    assert report.checks[0].detail.startswith("2 of 10 chunks dead")


def test_the_other_expectations_leave_the_poison_chunk_aside_and_only_it(tmp_path: Path) -> None:
    malformed, poison, other = "aaaa1111-order", "dddd4444-chunk", "ffff6666-chunk"
    letters = [
        {"id": 1, "task_id": malformed, "reason": "permanent"},
        {"id": 2, "task_id": poison, "reason": "permanent"},
    ]
    common: dict[str, Any] = {
        "malformed_order": 9,
        "accept_tasks": {9: malformed},
        "tracks": {malformed: Track(), poison: Track(), other: Track()},
    }
    for failed, ok in (({malformed, poison}, True), ({malformed, poison, other}, False)):
        console = Console(record=True, width=240, color_system=None)
        states = {t: "FAILURE" if t in failed else "SUCCESS" for t in common["tracks"]}
        rows = letters + ([{"id": 3, "task_id": other, "reason": "permanent"}] if not ok else [])
        report = Report(
            console,
            facts(
                tmp_path,
                csv_import=step(),
                states=states,
                dead_letters=[
                    {**r, "task_name": "t", "queue": "q", "attempts": 1, "args": []}
                    | {"error_type": "E", "error_message": "m"}
                    for r in rows
                ],
                **common,
            ),
        )
        report.outcomes()
        report.dead_letters()
        checks = {c.what: c for c in report.checks}
        assert checks["only the malformed order failed"].ok is ok
        assert checks["the malformed order is one dead letter, reason permanent"].ok is ok
        if ok:
            assert "(+1 of the import's poison chunk, 8c)" in (
                checks["the malformed order is one dead letter, reason permanent"].detail
            )
