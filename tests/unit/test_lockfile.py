"""The versions lock file, its check (`celery -A APP versions lock|check`) and the pytest
helper (pure: memory:// apps, files under tmp_path)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from jobs_platform import ReliableTask, create_app, lockfile
from jobs_platform.cli.versions import versions
from jobs_platform.testing import assert_versions_locked

ROOT = Path(__file__).resolve().parents[2]


def split(args: Any, kwargs: Any) -> tuple[Any, Any]:
    key, address = args
    street, _, city = address.rpartition(", ")
    return (key, street, city), kwargs


def release(which: str) -> Any:
    """The app of one release of ``ship``: ``v1``, ``v2`` (bumped, upcaster) or ``unbumped``
    (version 2's signature, version 1)."""
    app = create_app(f"lock{which}", broker_url="memory://", result_backend="cache+memory://")

    def ship_v1(key: str, address: str) -> None:
        return None

    def ship_v2(key: str, street: str, city: str) -> None:
        return None

    options: dict[str, Any] = {"base": ReliableTask, "name": "l.ship", "queue": "fast"}
    if which == "v1":
        app.task(**options)(ship_v1)
    elif which == "v2":
        app.task(**options, version=2, upcast={1: split})(ship_v2)
    else:
        app.task(**options)(ship_v2)
    return app


def run_cli(app: Any, *args: str) -> Any:
    return CliRunner().invoke(versions, list(args), obj=SimpleNamespace(app=app))


def test_lock_writes_each_task_name_version_and_signature(tmp_path: Path) -> None:
    path = tmp_path / "jobs.lock.json"
    done = run_cli(release("v2"), "lock", "--file", str(path))
    assert done.exit_code == 0, done.output
    tasks = json.loads(path.read_text())["tasks"]
    assert tasks["l.ship"] == {
        "version": 2,
        "signature": "(key: 'str', street: 'str', city: 'str')",
        "upcast": [1],
    }
    assert all(not name.startswith("celery.") for name in tasks)


def test_a_signature_changed_without_a_bump_fails_the_check_saying_what_changed(
    tmp_path: Path,
) -> None:
    path = tmp_path / "jobs.lock.json"
    lockfile.write(path, lockfile.entries(release("v1")))
    done = run_cli(release("unbumped"), "check", "--file", str(path))
    assert done.exit_code == 1
    assert (
        "l.ship: signature changed from (key: 'str', address: 'str') to (key: 'str', street: "
        "'str', city: 'str') but version is still 1: declare version=2 and upcast={1: ...}"
    ) in done.output
    with pytest.raises(AssertionError, match=r"l.ship: signature changed"):
        assert_versions_locked(release("unbumped"), path)


def test_a_bump_with_its_upcaster_passes_with_a_note(tmp_path: Path) -> None:
    path = tmp_path / "jobs.lock.json"
    lockfile.write(path, lockfile.entries(release("v1")))
    done = run_cli(release("v2"), "check", "--file", str(path))
    assert done.exit_code == 0, done.output
    assert "note: l.ship: version 1 -> 2 with its upcasters: re-lock" in done.output
    assert_versions_locked(release("v2"), path)
    # Unchanged code passes quietly.
    lockfile.write(path, lockfile.entries(release("v2")))
    assert run_cli(release("v2"), "check", "--file", str(path)).exit_code == 0


def test_a_missing_upcaster_a_lower_version_and_a_removed_task_fail() -> None:
    v1 = {"version": 1, "signature": "(a)", "upcast": []}
    v3 = {"version": 3, "signature": "(a, b)", "upcast": [2]}
    report = lockfile.compare({"t": v1, "gone": v1}, {"t": v3, "new": v1})
    assert report.problems == [
        "gone: in the lock file but no longer declared: its queued and delayed jobs would be "
        "poison dead letters (remove it once they drained, then re-lock)",
        "t: version bumped from 1 to 3 but there is no upcast[1]: payloads of those versions "
        "could not run",
    ]
    assert report.notes == ["new: new task, not in the lock file yet: re-lock"]
    down = lockfile.compare({"t": v3}, {"t": v1})
    assert down.problems[0].startswith("t: version went down from 3 to 1")


def test_check_without_a_lock_file_is_a_usage_error(tmp_path: Path) -> None:
    done = run_cli(release("v1"), "check", "--file", str(tmp_path / "none.json"))
    assert done.exit_code == 2
    assert "write it with `versions lock`" in done.output


def test_the_reference_app_matches_its_lock_file() -> None:
    from tasks.jobs import app

    assert_versions_locked(app, ROOT / "jobs.lock.json")


def test_the_reference_greeting_upcasts_version_1_payloads() -> None:
    from jobs_platform import versions
    from tasks.email import send_greeting_email

    spec = send_greeting_email.spec.versions
    assert spec.version == 2
    run = versions.fit(
        send_greeting_email.name,
        spec,
        1,
        (7, "Ada Lovelace"),
        {},
        send_greeting_email.bind_arguments,
    )
    assert run == versions.Run((7, "Ada", "Lovelace"), {})
