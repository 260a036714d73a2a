"""What an app gets from the schedule package: Celery config, maintenance tasks and entries,
the reference app's schedule (pure: no broker is contacted)."""

from __future__ import annotations

from typing import Any

import pytest
from celery.schedules import crontab

from jobs_platform import create_app, schedule
from jobs_platform.schedule import maintenance
from jobs_platform.schedule.policies import split_options
from jobs_platform.schedule.slots import interval_of


def test_celery_config_makes_plain_celery_beat_run_the_platform_scheduler() -> None:
    app = create_app("cfg")
    config = schedule.celery_config(app.jobs_settings)
    assert config["beat_scheduler"] == "jobs_platform.schedule.scheduler:Scheduler"
    # Celery resolves the name the way `celery beat` does.
    from celery.utils.imports import symbol_by_name

    from jobs_platform.schedule.scheduler import Scheduler

    assert symbol_by_name(config["beat_scheduler"]) is Scheduler
    # Short: the leader extends its lock each tick, a standby checks it each tick.
    assert 0 < config["beat_max_loop_interval"] <= 5


def test_create_app_runs_the_platform_beat_and_knows_the_maintenance_tasks() -> None:
    """Fails until create_app merges celery_config and calls install (the lead's wiring)."""
    app = create_app("wired")
    assert app.conf.beat_scheduler == schedule.SCHEDULER
    assert set(maintenance.TASK_NAMES) <= set(app._tasks)


def test_install_is_idempotent() -> None:
    app = create_app("twice")
    schedule.install(app)
    first = {name: app._tasks[name] for name in maintenance.TASK_NAMES}
    schedule.install(app)
    assert {name: app._tasks[name] for name in maintenance.TASK_NAMES} == first


@pytest.mark.parametrize(
    ("visibility_timeout", "margin"), [(3600.0, 60.0), (30.0, 5.0), (8.0, 2.0)]
)
def test_maintenance_tasks_fit_any_apps_visibility_timeout(
    visibility_timeout: float, margin: float
) -> None:
    # A test app with an 8 s visibility timeout must still start (its limits are checked
    # against the timeout when the tasks are declared and when the app finalizes).
    app = create_app(
        "short-vt",
        visibility_timeout=visibility_timeout,
        visibility_margin=margin,
        retry_backoff=0.2,
        retry_backoff_max=0.5,
        worker_lease=min(15.0, visibility_timeout / 4),
        unacked_restore_interval=min(5.0, visibility_timeout / 8),
    )
    schedule.install(app)
    app.finalize()
    for name in maintenance.TASK_NAMES:
        spec = app.tasks[name].spec
        budget = visibility_timeout - margin
        assert spec.time_limit_s + spec.policy.longest_wait_s < budget


def test_maintenance_tasks_run_on_their_queues() -> None:
    app = create_app("queues")
    schedule.install(app)
    queues = {name: app._tasks[name].spec.queue for name in maintenance.TASK_NAMES}
    assert queues == {
        maintenance.PURGE_DEAD_LETTERS: "heavy",
        maintenance.PURGE_IDEMPOTENCY_KEYS: "heavy",
        maintenance.CHECK_UNIQUE_LOCKS: "fast",
        maintenance.PRUNE_OUTBOX: "heavy",
        maintenance.PRUNE_BATCHES: "heavy",
    }


def test_maintenance_entries_are_valid_beat_entries() -> None:
    app = create_app("entries")
    entries = schedule.maintenance_schedule(app.jobs_settings)
    assert {e["task"] for e in entries.values()} == set(maintenance.TASK_NAMES)
    for name, entry in entries.items():
        assert isinstance(entry["schedule"], crontab)
        split_options(name, entry.get("options"))
    retention = entries["jobs.maintenance.dlq-retention"]
    assert retention["kwargs"] == {"older_than_days": app.jobs_settings.dlq_retention_days}


def test_the_reference_app_schedules_its_report_sync_and_maintenance() -> None:
    import tasks
    from tasks.schedule import BEAT_SCHEDULE

    schedule.install(tasks.app)  # what create_app does once wired (idempotent)
    assert tasks.app.conf.beat_schedule is BEAT_SCHEDULE
    by_name: dict[str, Any] = BEAT_SCHEDULE
    nightly = by_name["nightly-report"]
    assert nightly["schedule"] == crontab(minute=0, hour=2)
    assert tasks.app.tasks[nightly["task"]].queue == "heavy"
    sync = by_name["partner-sync-hourly"]
    assert sync["schedule"] == crontab(minute=0)
    assert tasks.app.tasks[sync["task"]].queue == "thirdparty"
    assert set(maintenance.TASK_NAMES) <= {e["task"] for e in BEAT_SCHEDULE.values()}
    for name, entry in BEAT_SCHEDULE.items():
        split_options(name, entry.get("options"))  # valid policies
        assert entry["task"] in tasks.app.tasks, name
        assert interval_of(entry["schedule"]) is None  # all crontabs, in UTC
    assert tasks.app.conf.timezone == "UTC"
