"""The runner's budget, order and deadline, and the command's output (no services)."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from jobs_platform.cli.health import health
from jobs_platform.health import runner
from jobs_platform.health.checks import Check
from jobs_platform.settings import Settings


def test_the_budget_leaves_room_for_a_late_canarys_second_round() -> None:
    budget = runner.Budget(5.0)
    assert (budget.ping_s, budget.reply_s) == (1.0, 1.0)
    assert budget.ping_s + budget.canary_s + budget.reply_s + runner.MARGIN_S == pytest.approx(5)
    small = runner.Budget(1.0)
    assert small.ping_s == small.reply_s == pytest.approx(0.2)
    assert small.canary_s == pytest.approx(0.3)


def test_names_follow_the_check_order_one_per_queue_where_it_applies() -> None:
    assert runner.names(["backlog", "broker", "canary"], ["fast", "heavy"]) == [
        "broker",
        "canary:fast",
        "canary:heavy",
        "backlog:fast",
        "backlog:heavy",
    ]


def test_a_check_still_running_at_the_deadline_fails_and_is_abandoned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    def hangs(url: str) -> Check:
        release.wait(30)  # a black-holed database connect
        return Check("database", True, "too late")

    monkeypatch.setattr(runner.checks, "database", hangs)
    app = SimpleNamespace(jobs_settings=Settings())
    start = time.monotonic()
    (check,) = runner.run(app, queues=["fast"], selected=["database"], timeout_s=1.0)
    took = time.monotonic() - start
    release.set()
    assert not check.ok and check.detail == "no answer within the 1 s timeout"
    assert took < 30  # the verdict did not wait for the hung check


def fake_app() -> Any:
    return SimpleNamespace(jobs_settings=Settings())


def invoke(monkeypatch: pytest.MonkeyPatch, results: list[Check], *args: str) -> Any:
    seen: dict[str, Any] = {}

    def fake_run(app: Any, **kwargs: Any) -> list[Check]:
        seen.update(kwargs)
        return results

    monkeypatch.setattr("jobs_platform.cli.health.run", fake_run)
    done = CliRunner().invoke(health, list(args), obj=SimpleNamespace(app=fake_app()))
    return done, seen


def test_healthy_output_is_one_line_per_check_and_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    results = [Check("broker", True, "answered"), Check("canary:fast", True, "round trip 3 ms")]
    done, seen = invoke(monkeypatch, results, "--queue", "fast")
    assert done.exit_code == 0, done.output
    lines = done.output.splitlines()
    assert lines[:2] == ["ok   broker: answered", "ok   canary:fast: round trip 3 ms"]
    assert lines[2].startswith("healthy: 2 checks passed in ")
    assert seen["queues"] == ["fast"] and seen["selected"] == list(runner.CHECKS)


def test_a_failure_exits_1_and_json_is_one_object(monkeypatch: pytest.MonkeyPatch) -> None:
    results = [Check("broker", True, "answered"), Check("spool", False, "not draining", 0.5)]
    done, _ = invoke(monkeypatch, results)
    assert done.exit_code == 1
    assert "FAIL spool: not draining" in done.output
    assert done.output.splitlines()[-1].startswith("UNHEALTHY: 1 of 2 checks failed")
    done, seen = invoke(monkeypatch, results, "--json", "--check", "spool", "--timeout", "2")
    assert done.exit_code == 1
    report = json.loads(done.output)
    assert report["ok"] is False and report["timeout_s"] == 2.0
    assert report["checks"][1] == {
        "name": "spool",
        "ok": False,
        "warn": False,
        "detail": "not draining",
        "elapsed_s": 0.5,
    }
    assert seen["selected"] == ["spool"] and seen["timeout_s"] == 2.0


def test_a_warning_passes_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    results = [
        Check("broker", True, "answered"),
        Check("breakers", True, "1 of 1 breaker(s) not closed: partner-x open", warn=True),
    ]
    done, _ = invoke(monkeypatch, results)
    assert done.exit_code == 0
    assert "WARN breakers: 1 of 1 breaker(s) not closed: partner-x open" in done.output
    assert done.output.splitlines()[-1].startswith("healthy: 2 checks passed (1 with a warning)")


def test_bad_options_are_usage_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for args in (["--queue", "slow"], ["--check", "nope"], ["--timeout", "0.1"]):
        done, _ = invoke(monkeypatch, [], *args)
        assert done.exit_code == 2, args
    done = CliRunner().invoke(health, [], obj=SimpleNamespace(app=SimpleNamespace()))
    assert done.exit_code == 2 and "create_app" in done.output
