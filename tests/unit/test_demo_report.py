"""The demo's report says what happened: which Redis the tour ran on and whose, and one row
per job of the killed worker. Pure: a report printed from hand-made facts, no service."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from tasks.demo import tour
from tasks.demo.broker import Broker
from tasks.demo.observe import Track
from tasks.demo.report import Report


def facts(tmp_path: Path, **fields: Any) -> tour.Facts:
    stack = SimpleNamespace(
        flower_auth=("demo", "pw"),
        flower_url="http://127.0.0.1:5555",
        metrics_url="http://127.0.0.1:9808/metrics",
        log_dir=tmp_path / "logs",
    )
    return tour.Facts(
        tour.SHORT,
        0.0,
        fields.pop("broker_url", "redis://127.0.0.1:6379/14"),
        f"sqlite:///{tmp_path}/jobs.sqlite3",
        tmp_path,
        stack,  # type: ignore[arg-type]
        **fields,
    )


def printed(report_facts: tour.Facts, section: str) -> tuple[str, Report]:
    console = Console(record=True, width=240, color_system=None)
    report = Report(console, report_facts)
    getattr(report, section)(*(("chart.png",) if section == "next_steps" else ()))
    return console.export_text(), report


def test_a_job_with_two_messages_held_by_the_killed_worker_is_one_row(tmp_path: Path) -> None:
    # The attempt that was running and its retry, already fetched: two messages, one job.
    kill = tour.Kill(
        "thirdparty-1@demo",
        4242,
        at=100.0,
        charges_in_flight=1,
        held=[
            ("aaaa1111-job", "tasks.shop.reserve_stock"),
            ("bbbb2222-job", "tasks.billing.send_invoice_email"),
            ("aaaa1111-job", "tasks.shop.reserve_stock"),
        ],
    )
    run = facts(
        tmp_path,
        kill=kill,
        tracks={"aaaa1111-job": Track(started=[99.0, 120.0]), "bbbb2222-job": Track()},
        states={"aaaa1111-job": "SUCCESS", "bbbb2222-job": "SUCCESS"},
    )
    text, report = printed(run, "kill")
    rows = [line for line in text.splitlines() if line.lstrip("│┃ ").startswith(("aaaa", "bbbb"))]
    assert [row.split()[1] for row in rows] == ["aaaa1111", "bbbb2222"], text
    [check] = report.checks
    assert check.ok and check.detail == "2 held (3 messages), 0 not finished"


def test_the_report_says_the_tour_ran_on_a_database_of_the_users_redis_not_a_private_one(
    tmp_path: Path,
) -> None:
    # Not on port 6379, and still the user's: what decides is who started it.
    claimed = Broker("redis://:s3cret@10.0.0.7:6380/14", private=False, why="from JOBS_BROKER_URL")
    text, _ = printed(facts(tmp_path, broker_url=claimed.url, broker=claimed), "next_steps")
    said = " ".join(text.split())
    assert (
        "the broker was database 14 of the Redis at redis://:***@10.0.0.7:6380 (from "
        "JOBS_BROKER_URL), empty when the tour began and claimed for it; flushed at the end"
    ) in said
    assert "private" not in said and "s3cret" not in said


def test_the_report_says_the_tour_ran_on_its_own_redis_server(tmp_path: Path) -> None:
    private = Broker("redis://127.0.0.1:40123/0", private=True, why="JOBS_BROKER_URL is not set")
    text, _ = printed(facts(tmp_path, broker_url=private.url, broker=private), "next_steps")
    said = " ".join(text.split())
    assert (
        "the broker was a private redis-server at redis://127.0.0.1:40123/0, started for the "
        "tour (JOBS_BROKER_URL is not set); stopped at the end"
    ) in said
