"""The canary task's declaration and its verdicts (pure: memory broker, no worker)."""

from __future__ import annotations

import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from jobs_platform.health import CANARY_TASK, canary, install
from jobs_platform.health.canary import Progress, late_verdict


def make_app() -> Any:
    return create_app("canaryunit", broker_url="memory://", result_backend="cache+memory://")


def test_install_registers_one_canary_that_any_queue_can_run() -> None:
    app = make_app()
    task = install(app)
    assert install(app) is task  # idempotent: create_app and an app module may both call it
    assert isinstance(task, ReliableTask) and app.tasks[CANARY_TASK] is task
    assert task.max_retries == 0 and task.ignore_result
    assert task.time_limit == canary.CANARY_TIME_LIMIT_S
    assert task.soft_time_limit < task.time_limit
    for queue in ("fast", "heavy", "thirdparty"):
        route = app.amqp.router.route({"queue": queue}, CANARY_TASK, (), {})
        assert route["queue"].name == queue


def test_a_late_canary_does_nothing() -> None:
    # Its deadline passed: returns before touching Redis (there is none at this URL).
    assert canary.report("redis://127.0.0.1:1/0", "id", time.time() - 1) is False


def test_a_canary_that_cannot_report_logs_instead_of_raising() -> None:
    assert canary.report("redis://127.0.0.1:1/0", "id", time.time() + 60) is False


def stats(total: dict[str, int], slots: int = 2) -> dict[str, Any]:
    return {"total": total, "pool": {"max-concurrency": slots}}


def test_progress_reads_running_slots_and_jobs_started_meanwhile() -> None:
    before = {"w": stats({"a": 3, CANARY_TASK: 5})}
    after = {"w": stats({"a": 4, CANARY_TASK: 9})}
    active = {"w": [{"name": "a"}, {"name": CANARY_TASK}]}
    seen = canary.progress("w", before, after, active)
    assert seen == Progress("w", True, running=1, slots=2, finished=1)
    assert seen.busy
    assert canary.progress("x", before, after, active) == Progress("x", answered=False)


def test_a_busy_queue_passes_and_a_stuck_one_fails() -> None:
    full = Progress("h@1", True, running=2, slots=2, finished=0)
    moving = Progress("f@1", True, running=0, slots=4, finished=37)
    idle = Progress("t@1", True, running=0, slots=1, finished=0)
    silent = Progress("s@1", answered=False)
    ok, detail = late_verdict("heavy", 2.7, [full, moving])
    assert ok and detail.startswith("busy: canary waits behind running jobs")
    ok, detail = late_verdict("thirdparty", 2.7, [idle])
    assert not ok
    assert detail == (
        "no canary back within 2.7 s: alive but not consuming? "
        "(t@1: 0/1 running, 0 started meanwhile)"
    )
    ok, detail = late_verdict("heavy", 2.7, [full, silent])
    assert not ok and "s@1 did not answer" in detail
    ok, detail = late_verdict("fast", 2.7, [])
    assert not ok and "no worker consumes fast" in detail
