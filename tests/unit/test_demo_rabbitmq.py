"""``make demo BROKER=rabbitmq``: the choice of broker, and the report's lines that depend on
it (the header, the delayed jobs without a store, the refused fairness_key, the kill read
from the task events). Pure: hand-made facts, no service; the tour itself is run by hand
(docs/demo.md, "On RabbitMQ")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from jobs_platform.brokers.rabbitmq import BROKER as RABBITMQ
from jobs_platform.errors import ConfigError
from tasks.demo import broker, fairness, launch, tour
from tasks.demo.observe import EventLog, Track
from tasks.demo.report import Report

AMQP = "amqp://guest:guest@127.0.0.1:5672/jobs-demo-abc123"


def rabbit(**fields: Any) -> broker.Broker:
    return broker.Broker(
        "redis://127.0.0.1:40000/0", private=True, kind="rabbitmq", amqp_url=AMQP, **fields
    )


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
        AMQP,
        f"sqlite:///{tmp_path}/jobs.sqlite3",
        tmp_path,
        stack,  # type: ignore[arg-type]
        broker=rabbit(),
        **fields,
    )


def report_of(run: tour.Facts) -> tuple[Console, Report]:
    console = Console(record=True, width=400, color_system=None)
    return console, Report(console, run)


def test_the_broker_is_chosen_by_flag_or_environment() -> None:
    assert broker.kind_of("") == "redis"
    assert broker.kind_of(" RabbitMQ ") == "rabbitmq"
    with pytest.raises(ConfigError, match="redis or rabbitmq"):
        broker.kind_of("kafka")
    env = {broker.KIND_ENV: "rabbitmq"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        assert launch.parse_args([]).broker == "rabbitmq"
        assert launch.parse_args(["--broker", "redis"]).broker == "redis"


def test_on_rabbitmq_the_processes_get_the_vhost_and_the_redis_for_coordination() -> None:
    chosen = rabbit()
    assert chosen.broker_url == AMQP and chosen.url.startswith("redis://")
    assert chosen.vhost == "jobs-demo-abc123" and chosen.name == "RabbitMQ"
    assert broker.from_env(chosen.to_env()) == chosen
    said = chosen.describe() + "; " + chosen.fate()
    assert "RabbitMQ at 127.0.0.1:5672, vhost jobs-demo-abc123" in said
    assert "coordination and results on a private redis-server" in said
    assert "guest" not in said  # no password shown
    assert "vhost jobs-demo-abc123 deleted at the end" in said
    kept = rabbit(keep_vhost=True).fate()
    assert "rabbitmqctl delete_vhost jobs-demo-abc123" in kept


def test_the_report_header_says_rabbitmq_and_what_is_redis_only(tmp_path: Path) -> None:
    console, report = report_of(facts(tmp_path))
    report.header()
    text = " ".join(console.export_text().split())
    assert "Report: the short tour on RabbitMQ" in text
    assert "no delayed store" in text and "fairness_key is refused" in text
    assert "no priorities" in text


def test_the_delayed_jobs_on_rabbitmq_are_judged_without_a_store(tmp_path: Path) -> None:
    delayed = tour.Delayed(
        task_id="export-1",
        countdown_s=8.0,
        time_limit_s=60.0,
        dispatched_at=10.0,
        stored=True,
        listing="celery_delayed_16\t16\ncelery_delayed_3\t1",
        reminders=[f"reminder-{n}" for n in range(16)],
        reminders_stored=16,
        cancel_summary="app.control.revoke() of 16 id(s): 16 recorded",
        probe="probe-1",
        probe_customer=424242,
        first_level="celery_delayed_3",
    )
    run = facts(
        tmp_path,
        delayed=delayed,
        tracks={
            "export-1": Track(received=[18.2], started=[18.3], succeeded=18.4),
            "probe-1": Track(sent=[11.0]),
        },
        states={"export-1": "SUCCESS", "probe-1": "REVOKED"},
    )
    console, report = report_of(run)
    report.delayed()
    text = " ".join(console.export_text().split())
    assert "RabbitMQ's delayed-delivery queues (no delayed store)" in text
    assert "celery_delayed_3" in text
    assert {c.what: c.ok for c in report.checks} == {
        "the delayed export waited in RabbitMQ (no worker got it before it was due) and ran "
        "exactly once": True,
        "the 24-hour reminders waited in RabbitMQ, and were revoked": True,
        "a reminder revoked while it waited was skipped when it arrived": True,
    }
    # The revoked reminder is not one of the run's jobs (it never ends).
    assert "probe-1" not in report.jobs


def test_a_revoked_reminder_that_ran_fails_its_expectation(tmp_path: Path) -> None:
    delayed = tour.Delayed("", 8.0, 60.0, 10.0, probe="probe-1", probe_customer=1)
    delayed.task_id = "export-1"
    run = facts(
        tmp_path,
        delayed=delayed,
        tracks={"probe-1": Track(started=[14.0], succeeded=14.1)},
        states={"probe-1": "SUCCESS"},
    )
    _, report = report_of(run)
    report.delayed()
    skipped = [c for c in report.checks if c.what.startswith("a reminder revoked")]
    assert [c.ok for c in skipped] == [False]


def test_the_tenant_storm_on_rabbitmq_shows_the_refusal(tmp_path: Path) -> None:
    storm = fairness.Storm(["b"] * 4, ["s"] * 2, order=["big"] * 4 + ["small"] * 2)
    console = Console(record=True, width=400, color_system=None)
    checks: list[tuple[str, bool, str]] = []
    fairness.report_fifo(console, storm, lambda *c: checks.append(c), RABBITMQ.no_fair_queues)
    text = " ".join(console.export_text().split())
    assert "fairness_key needs a broker that takes a queue's jobs round robin" in text
    assert "all of them started after 4 of big's 4" in text
    assert [(what, ok) for what, ok, _ in checks] == [
        ("fairness_key refused on RabbitMQ at declaration, with its reason", True),
        ("every statement of the tenant storm ran", True),
    ]


def test_the_delay_levels_a_wait_starts_in() -> None:
    assert tour.first_level(8) == "celery_delayed_3"
    assert tour.first_level(45) == "celery_delayed_5"
    assert tour.first_level(24 * 3600) == "celery_delayed_16"
    assert tour.first_level(2.4) == "celery_delayed_1"  # rounded up to 3 s


def test_the_killed_workers_jobs_are_read_from_the_task_events() -> None:
    events = EventLog.__new__(EventLog)
    events._tracks = {  # type: ignore[assignment]
        "running": Track(name="charge", received=[5.0], hostnames=["victim@demo"]),
        "done": Track(name="charge", received=[5.0], hostnames=["victim@demo"], succeeded=6.0),
        "retried": Track(
            name="charge", received=[5.0], hostnames=["victim@demo"], retried=[(6.0, "")]
        ),
        "elsewhere": Track(name="charge", received=[5.0], hostnames=["other@demo"]),
        "later": Track(name="charge", received=[12.0], hostnames=["victim@demo"]),
        "ended-after": Track(
            name="reserve", received=[5.0], hostnames=["victim@demo"], succeeded=20.0
        ),
    }
    import threading

    events._lock = threading.Lock()
    held = tour.held_by_events(events, "victim@demo", at=10.0)
    assert sorted(held) == [("ended-after", "reserve"), ("running", "charge")]
