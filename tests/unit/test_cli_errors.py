"""A ConfigError or DispatchError at the ``celery`` command line is one short message and a
non-zero exit, whatever the command; JOBS_CLI_TRACEBACK=1 brings the traceback back; any
other error keeps Celery's own output (real ``celery`` subprocesses; memory:// broker, no
service is contacted: every case fails before a connection)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

APP_PY = """
import os

from jobs_platform import ReliableTask, create_app

app = create_app("cleanerrors", broker_url="memory://", result_backend="cache+memory://")


@app.task(base=ReliableTask, name="clean.settle", queue="fast")
def settle(*args, **kwargs):
    return None


if os.environ.get("RAISE_AT_IMPORT") == "dispatch":
    settle.delay(tags={"a"})
if os.environ.get("RAISE_AT_IMPORT") == "other":
    raise RuntimeError("a bug in the app module")
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cleanerrors")
    (root / "cleanapp.py").write_text(textwrap.dedent(APP_PY))
    return root


def celery(project: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "cleanapp", *args],
        env={**clean, "PYTHONPATH": str(project), **env},
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "command",
    [["dlq", "list"], ["db", "upgrade"], ["worker"], ["inspect", "ping"], ["beat"], ["report"]],
)
def test_a_config_error_while_loading_the_app_is_one_short_message(
    project: Path, command: list[str]
) -> None:
    """It used to be Celery's usage error with a 50-line traceback, for every command."""
    done = celery(project, *command, JOBS_MAX_RETRIES="-1")
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.splitlines()[-2:] == [
        "Error: max_retries must be between 0 and 1000, got -1",
        "(ConfigError while loading cleanapp; JOBS_CLI_TRACEBACK=1 shows the traceback)",
    ]
    assert "Unable to load celery application" not in done.stderr


def test_a_config_error_inside_a_command_is_one_short_message(project: Path) -> None:
    done = celery(project, "worker", "-Q", "nope")  # the worker's start-up check
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.splitlines()[-2:] == [
        "Error: -Q/-X nope: no such queue; the queues are fast, heavy, thirdparty (queues are "
        "declared by jobs-platform, never created on the fly)",
        "(ConfigError; JOBS_CLI_TRACEBACK=1 shows the traceback)",
    ]


def test_a_dispatch_error_is_one_short_message(project: Path) -> None:
    done = celery(project, "dlq", "list", RAISE_AT_IMPORT="dispatch")
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert done.stderr.splitlines()[-2].startswith(
        "Error: clean.settle: argument kwargs['tags'] is a set"
    )
    assert "(DispatchError while loading cleanapp;" in done.stderr


def test_the_traceback_is_shown_when_asked_for(project: Path) -> None:
    done = celery(project, "dlq", "list", JOBS_MAX_RETRIES="-1", JOBS_CLI_TRACEBACK="1")
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "rules.py" in done.stderr
    assert "ConfigError: max_retries must be between 0 and 1000, got -1" in done.stderr


def test_other_errors_keep_celerys_own_report(project: Path) -> None:
    """Only the platform's own errors are shortened: a bug keeps its traceback."""
    done = celery(project, "dlq", "list", RAISE_AT_IMPORT="other")
    assert done.returncode != 0
    assert "Unable to load celery application" in done.stderr
    assert "Traceback" in done.stderr and "RuntimeError: a bug in the app module" in done.stderr
