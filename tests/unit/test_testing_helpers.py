"""The pure helpers of jobs_platform.testing: FakeClock, the dead-letter factory, the
assertion on a SQLite file, and the plugin's small decisions (no worker, no broker)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jobs_platform.clock import utcnow
from jobs_platform.deadletter import alerts
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.errors import ConfigError
from jobs_platform.testing import (
    FakeClock,
    assert_dead_lettered,
    dead_letter,
    free_port,
    redis_db,
    wait_for,
)
from jobs_platform.testing.plugin import check_services, import_path
from jobs_platform.testing.redis_db import server_url

# -- FakeClock -------------------------------------------------------------------------


def test_clock_moves_only_when_advanced_and_both_readings_together() -> None:
    clock = FakeClock()
    assert clock.monotonic() == 0.0  # a machine that has just booted
    assert clock.now() == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    assert clock.monotonic() == 0.0 and clock.now() == clock.now()  # reading is not moving

    clock.advance(90)
    clock.advance(dt.timedelta(minutes=1, milliseconds=500))
    assert clock.monotonic() == pytest.approx(150.5)
    assert clock.now() == dt.datetime(2026, 1, 1, 0, 2, 30, 500_000, tzinfo=dt.UTC)
    assert clock.elapsed == pytest.approx(150.5)
    assert "2026-01-01T00:02:30.500000+00:00" in repr(clock)


def test_clock_start_is_aware_utc() -> None:
    naive = FakeClock(dt.datetime(2026, 5, 1, 12, 0), monotonic_start=1e6)
    assert naive.now() == dt.datetime(2026, 5, 1, 12, 0, tzinfo=dt.UTC)  # naive means UTC
    plus_two = dt.timezone(dt.timedelta(hours=2))
    converted = FakeClock(dt.datetime(2026, 5, 1, 14, 0, tzinfo=plus_two))
    assert converted.now().tzinfo is dt.UTC
    assert converted.now() == naive.now()
    assert naive.monotonic() == 1e6


@pytest.mark.parametrize("step", [-1, -0.001, dt.timedelta(seconds=-5), float("nan"), float("inf")])
def test_clock_refuses_to_run_backwards_or_to_infinity(step: Any) -> None:
    clock = FakeClock()
    with pytest.raises(ValueError, match="advance"):
        clock.advance(step)
    assert clock.elapsed == 0.0


def test_clock_refuses_a_non_finite_monotonic_start() -> None:
    with pytest.raises(ValueError, match="monotonic_start"):
        FakeClock(monotonic_start=float("nan"))


def test_clock_drives_the_webhook_window(caplog: pytest.LogCaptureFixture) -> None:
    # The notifier reads clock.monotonic from its own thread: the first POST is never held,
    # the next waits for the window, measured only on the fake clock.
    clock = FakeClock()
    notifier = alerts.WebhookNotifier(
        f"http://127.0.0.1:{free_port()}/dead", interval_s=60, clock=clock.monotonic
    )
    try:
        assert notifier.window_left() == 0.0
        notifier.notify(1, dead_letter())
        wait_for(lambda: notifier.window_left() > 0, timeout_s=10, message="the first POST attempt")
        assert notifier.window_left() == 60.0
        clock.advance(45)
        assert notifier.window_left() == 15.0
        clock.advance(15)
        assert notifier.window_left() == 0.0
    finally:
        notifier.close()


# -- dead_letter ---------------------------------------------------------------------


def test_dead_letter_defaults_are_a_stored_looking_exhausted_job() -> None:
    before = utcnow()
    letter = dead_letter()
    assert isinstance(letter, DeadLetter)
    assert (letter.reason, letter.task_name, letter.queue) == (
        "exhausted",
        "billing.charge",
        "fast",
    )
    assert before <= letter.failed_at <= utcnow() and letter.failed_at.tzinfo is not None
    assert (letter.args, letter.kwargs, letter.attempts) == ([], {}, 1)
    [error] = letter.errors
    assert error == {
        "type": "builtins.ConnectionError",
        "message": "connection refused",
        "at": letter.failed_at.isoformat(timespec="milliseconds"),
        "attempt": 1,
    }
    assert letter.error_type == "builtins.ConnectionError"
    assert letter.http_status is None
    # Storable as is, and through the spool.
    row = letter.row()
    assert row["status"] == "dead" and row["error_message"] == "connection refused"
    assert DeadLetter.from_json(letter.to_json()) == letter


def test_dead_letters_made_in_a_loop_are_distinct_rows() -> None:
    letters = [dead_letter() for _ in range(50)]
    assert len({letter.task_id for letter in letters}) == 50
    assert len({letter.dedupe_key for letter in letters}) == 50
    # ... of one cause: the fingerprint groups them.
    assert len({letter.fingerprint for letter in letters}) == 1


def test_dead_letter_history_follows_attempts_and_http_status_lands_on_the_last() -> None:
    failed_at = dt.datetime(2026, 3, 1, 9, 30, tzinfo=dt.UTC)
    letter = dead_letter(
        attempts=3,
        failed_at=failed_at,
        error_type="urllib.error.HTTPError",
        message="HTTP Error 503: Service Unavailable",
        http_status=503,
    )
    assert [e["attempt"] for e in letter.errors] == [1, 2, 3]
    assert {e["at"] for e in letter.errors} == {"2026-03-01T09:30:00.000+00:00"}
    assert [e.get("status") for e in letter.errors] == [None, None, 503]
    assert letter.http_status == 503 and letter.error_type == "urllib.error.HTTPError"
    # Status and reason are part of the cause.
    assert (
        letter.fingerprint
        != dead_letter(
            error_type="urllib.error.HTTPError",
            message="HTTP Error 503: Service Unavailable",
            http_status=404,
        ).fingerprint
    )
    assert dead_letter(attempts=0).errors == []  # a poison message never ran


def test_dead_letter_overrides_any_field() -> None:
    errors = [{"type": "E", "message": "m", "at": "x", "attempt": 1}]
    letter = dead_letter(
        reason="poison",
        task_id="t-1",
        task_name="myproj.jobs.reject",
        queue="thirdparty",
        args=None,
        kwargs={"password": "hunter2"},
        errors=errors,
        chain="c",
        priority=5,
    )
    assert (letter.reason, letter.task_id, letter.task_name) == (
        "poison",
        "t-1",
        "myproj.jobs.reject",
    )
    assert (letter.queue, letter.args, letter.errors, letter.chain) == (
        "thirdparty",
        None,
        errors,
        "c",
    )
    assert letter.kwargs == {"password": "hunter2"} and letter.priority == 5
    assert letter.dedupe_key == dead_letter(task_id="t-1", chain="c").dedupe_key


def test_dead_letter_refuses_unknown_fields_with_a_hint() -> None:
    with pytest.raises(TypeError, match=r"\['task'\].*did you mean 'task_id'"):
        dead_letter(task="billing.charge")
    with pytest.raises(TypeError, match="unknown field"):
        dead_letter(colour="red")


def test_dead_letter_refuses_errors_together_with_what_shapes_them() -> None:
    # Either would be silently ignored otherwise.
    with pytest.raises(TypeError, match="errors= or http_status, message, not both"):
        dead_letter(errors=[], message="boom", http_status=500)


# -- assert_dead_lettered (on a SQLite file) -----------------------------------------


@pytest.fixture()
def database(tmp_path: Path) -> str:
    from jobs_platform import db

    url = f"sqlite:///{tmp_path}/jobs.sqlite3"
    db.upgrade(url)
    return url


def store(url: str) -> Any:
    from jobs_platform.deadletter.store import DeadLetterStore

    return DeadLetterStore(url)


class App:
    """Just what assert_dead_lettered reads from an app made by create_app."""

    def __init__(self, database_url: str) -> None:
        self.jobs_settings = type("S", (), {"database_url": database_url})()


def test_assert_dead_lettered_returns_the_row(database: str) -> None:
    letter = dead_letter(reason="permanent", args=[41], task_name="myproj.jobs.reject")
    row_id = store(database).add(letter)
    row = assert_dead_lettered(App(database), str(letter.task_id), reason="permanent")
    assert row["id"] == row_id and row["args"] == [41] and row["task_name"] == "myproj.jobs.reject"
    # A URL does too, and no reason means any.
    assert assert_dead_lettered(database, str(letter.task_id))["id"] == row_id


def test_assert_dead_lettered_fails_at_once_listing_rows_of_another_reason(database: str) -> None:
    letter = dead_letter(reason="exhausted", message="partner said 503")
    store(database).add(letter)
    with pytest.raises(AssertionError) as failure:
        assert_dead_lettered(database, str(letter.task_id), reason="permanent", timeout_s=30)
    text = str(failure.value)
    assert f"task {letter.task_id} was dead-lettered, but not with reason 'permanent'" in text
    assert "reason=exhausted" in text and "partner said 503" in text
    assert failure.value.__traceback__ is not None


def test_assert_dead_lettered_times_out_with_where_it_looked(database: str) -> None:
    with pytest.raises(
        AssertionError,
        match="no dead letter with reason 'permanent' for task "
        r"nope in sqlite:///.*jobs.sqlite3 after 0.3 s",
    ):
        assert_dead_lettered(database, "nope", reason="permanent", timeout_s=0.3)


def test_assert_dead_lettered_waits_for_a_row_that_arrives_later(database: str) -> None:
    import threading

    letter = dead_letter()
    timer = threading.Timer(0.5, store(database).add, args=(letter,))
    timer.start()
    try:
        row = assert_dead_lettered(database, str(letter.task_id), reason="exhausted", timeout_s=20)
    finally:
        timer.join()
    assert row["dedupe_key"] == letter.dedupe_key


def test_clock_drives_an_idempotency_lease(database: str) -> None:
    from jobs_platform import IdempotencyKeys

    clock = FakeClock()
    keys = IdempotencyKeys(database, ttl_s=3600, clock=clock.now)
    assert keys.claim("invoice-7", task="t", lease_s=30, owner="a").claimed
    busy = keys.claim("invoice-7", task="t", lease_s=30, owner="b")
    assert busy.outcome == "busy"
    assert busy.lease_expires_at == clock.now() + dt.timedelta(seconds=30)
    clock.advance(29)
    assert keys.claim("invoice-7", task="t", lease_s=30, owner="b").outcome == "busy"
    clock.advance(2)  # a's lease ran out on the fake clock alone
    assert keys.claim("invoice-7", task="t", lease_s=30, owner="b").claimed


def test_assert_dead_lettered_refuses_something_that_is_not_an_app() -> None:
    with pytest.raises(TypeError, match="create_app"):
        assert_dead_lettered(object(), "t-1")


# -- the plugin's small decisions ----------------------------------------------------


def test_server_url_drops_the_database_number_and_refuses_other_schemes() -> None:
    assert server_url("redis://:pw@127.0.0.1:6379/3") == "redis://:pw@127.0.0.1:6379"
    assert server_url("rediss://cache.internal:6380") == "rediss://cache.internal:6380"
    with pytest.raises(ConfigError, match=r"redis:// or rediss://.*'amqp://u:\*\*\*@h'"):
        server_url("amqp://u:secret@h")


def test_without_jobs_test_redis_and_redis_server_the_session_is_refused_not_sent_to_6379(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A Redis that answers on 127.0.0.1:6379 may be the one the app uses for real: the
    # tests take it only when JOBS_TEST_REDIS names it (the unit guard would also fail
    # this test at any connection to 6379).
    monkeypatch.setattr(redis_db.shutil, "which", lambda name: None)
    for configured in (None, "private"):
        with pytest.raises(ConfigError) as refused, redis_db.session_redis(configured):
            pass
        message = str(refused.value)
        assert "redis-server is not installed" in message
        assert "JOBS_TEST_REDIS=redis://host:port" in message


def test_an_app_created_before_the_test_environment_is_refused_by_name() -> None:
    class Settings:
        broker_url = "redis://:pw@127.0.0.1:6379/0"
        database_url = "sqlite:///ok.sqlite3"

    class Stale:
        jobs_settings = Settings()

    env = {
        "JOBS_BROKER_URL": "redis://:pw@127.0.0.1:6379/14",
        "JOBS_DATABASE_URL": "sqlite:///ok.sqlite3",
    }
    with pytest.raises(ConfigError) as refused:
        check_services(Stale(), "myproj.jobs", env)
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("myproj.jobs was imported before the test's JOBS_* environment")
    # Only what differs is named, with passwords masked.
    assert lines[1:-1] == [
        "  broker redis://:***@127.0.0.1:6379/0 (the test's: redis://:***@127.0.0.1:6379/14)"
    ]
    assert "jobs_env_at_startup = true" in lines[-1]
    Settings.broker_url = env["JOBS_BROKER_URL"]
    check_services(Stale(), "myproj.jobs", env)  # the same services: accepted
    with pytest.raises(ConfigError, match=r"not made by jobs_platform\.create_app"):
        check_services(object(), "myproj.jobs", env)


def test_a_profile_worker_is_the_worker_profile_command_with_its_overrides() -> None:
    from jobs_platform.profiles import PROFILES, worker_argv
    from jobs_platform.testing import WorkerProcess

    worker = WorkerProcess.for_profile(
        "myproj.jobs", "thirdparty", concurrency=1, hostname="t@h", extra_args=["-O", "fair"]
    )
    expected = worker_argv(
        "myproj.jobs", "thirdparty", hostname="t@h", concurrency=1, extra=["-O", "fair"]
    )
    # The concurrency asked for reaches the command line (it used to keep the profile's 8).
    assert worker.argv() == [sys.executable, "-m", *expected]
    assert worker.argv()[worker.argv().index("-c") + 1] == "1"
    assert worker.concurrency == 1 and worker.pool == PROFILES["thirdparty"].pool
    default = WorkerProcess.for_profile("myproj.jobs", "thirdparty", hostname="t@h")
    assert default.argv() == [
        sys.executable,
        "-m",
        *worker_argv("myproj.jobs", "thirdparty", hostname="t@h"),
    ]


def test_import_path_keeps_project_directories_not_the_interpreters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    monkeypatch.chdir(project)
    monkeypatch.setattr(
        sys, "path", ["", str(project / "src"), site_packages, str(project / "src"), "/nonexistent"]
    )
    assert import_path().split(os.pathsep) == [
        str(project.resolve()),
        str((project / "src").resolve()),
    ]


def test_importing_the_plugin_loads_no_worker_and_no_sqlalchemy() -> None:
    # Every pytest run in an environment with jobs-platform installed imports the plugin.
    code = (
        "import json, sys; import jobs_platform.testing.plugin; "
        "heavy = ('sqlalchemy', 'alembic', 'celery.worker', 'celery.apps.worker', "
        "'pytest_celery'); "
        "print(json.dumps([m for m in heavy if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(done.stdout) == []
