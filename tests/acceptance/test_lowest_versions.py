"""The wheel at the lowest supported versions, next to an application's own narrower ranges
(``make lowest``: .venv-lowest, built from constraints-lowest.txt with ``sqlalchemy>=2.0,<2.1
alembic<1.15 tenacity<9 redis>=6.4,<7``, then this checkout's wheel installed over it).

A team's package outside this repository, a real worker started with ``worker-profile``: a
job retried then dead-lettered with datetime/Decimal/UUID arguments, and replayed. Runs only
in that environment (``JOBS_LOWEST_VERSIONS=1``): the main suite covers the pinned versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import redis
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from jobs_platform.testing import WorkerProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(
        os.environ.get("JOBS_LOWEST_VERSIONS") != "1",
        reason="runs in make lowest (.venv-lowest), on the lowest supported versions",
    ),
]

#: The application's own ranges (issue 17's), installed next to the wheel.
APP_RANGES = {
    "sqlalchemy": ">=2.0,<2.1",
    "alembic": "<1.15",
    "tenacity": "<9",
    "redis": ">=6.4,<7",
}

JOBS_PY = """
import os

import redis

from jobs_platform import ReliableTask, create_app

app = create_app("lowest", retry_backoff=0.2, retry_backoff_max=0.4, dlq_drain_interval=0.5)
runs = redis.Redis.from_url(os.environ["JOBS_BROKER_URL"])


@app.task(base=ReliableTask, bind=True, queue="fast", max_retries=1)
def settle(self, key, when, amount=None, ref=None):
    seen = [[type(v).__name__, str(v)] for v in (when, amount, ref)]
    runs.rpush(f"lowest:seen:{key}", repr(seen).replace("'", '"'))
    if not runs.exists(f"lowest:fixed:{key}"):
        raise ConnectionError(f"partner down for {key}")
"""

DISPATCH_PY = """
import datetime as dt, sys, uuid
from decimal import Decimal

from myproj.jobs import settle

when = dt.datetime(2026, 3, 1, 12, 30, tzinfo=dt.timezone.utc)
print(settle.delay(sys.argv[1], when, amount=Decimal("19.90"), ref=uuid.UUID(int=7)).id)
"""


def pins(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            found[name.strip().lower()] = version.strip()
    return found


def test_the_environment_holds_the_floors_and_the_applications_ranges() -> None:
    floors = pins(ROOT / "constraints-lowest.txt")
    installed = {name: metadata.version(name) for name in floors}
    assert installed == floors  # pip may not have moved any of them
    for name, spec in APP_RANGES.items():
        assert SpecifierSet(spec).contains(installed[name]), (name, installed[name])
    # The wheel's declared ranges accept every floor (what `pip check` also says).
    declared = [Requirement(r) for r in metadata.requires("jobs-platform") or []]
    for requirement in declared:
        if requirement.marker is None and requirement.name.lower() in floors:
            assert requirement.specifier.contains(floors[requirement.name.lower()]), requirement
    direct = metadata.distribution("jobs-platform").read_text("direct_url.json") or ""
    assert '"editable": true' not in direct  # the wheel, not an editable checkout


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lowest-project")
    (root / "myproj").mkdir()
    (root / "myproj" / "__init__.py").write_text("")
    (root / "myproj" / "jobs.py").write_text(textwrap.dedent(JOBS_PY))
    (root / "dispatch.py").write_text(textwrap.dedent(DISPATCH_PY))
    return root


@pytest.fixture()
def env(redis_url: str, project: Path) -> Iterator[dict[str, str]]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JOBS_")}
    clean.pop("PYTHONPATH", None)
    yield {
        **clean,
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": f"sqlite:///{project}/lowest.sqlite3",
    }


def run(args: list[str], project: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=project, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_a_retried_job_dead_letters_and_replays_with_its_typed_arguments(
    project: Path, env: dict[str, str], redis_url: str, tmp_path: Path
) -> None:
    celery = ["-m", "celery", "-A", "myproj.jobs"]
    found = run(["-c", "import jobs_platform; print(jobs_platform.__file__)"], project, env)
    assert not found.startswith(str(ROOT / "jobs_platform")), "the checkout, not the wheel"
    assert "revision" in run([*celery, "db", "upgrade"], project, env)
    hostname = f"lowest-{uuid.uuid4().hex[:6]}@myproj"
    argv = [sys.executable, *celery, "worker-profile", "fast", "-c", "1", "-n", hostname]
    worker = WorkerProcess(
        "myproj.jobs",
        ["fast"],
        hostname=hostname,
        env=env,
        cwd=str(project),
        log_dir=str(tmp_path),
        argv=argv,
    )
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = uuid.uuid4().hex
    expected = [
        ["datetime", "2026-03-01 12:30:00+00:00"],
        ["Decimal", "19.90"],
        ["UUID", str(uuid.UUID(int=7))],
    ]
    try:
        worker.start(timeout_s=90)
        task_id = run(["dispatch.py", key], project, env).strip()

        def dead_row() -> dict[str, Any] | None:
            listed = run([*celery, "dlq", "list", "--json"], project, env)
            rows = [json.loads(line) for line in listed.splitlines() if line.strip()]
            return next((r for r in rows if r["task_id"] == task_id), None)

        row = wait_for(dead_row, timeout_s=60, message="the retried job's dead letter")
        assert (row["reason"], row["attempts"]) == ("exhausted", 2)
        assert row["kwargs"]["amount"] == {"__type__": "decimal", "__value__": "19.90"}
        seen = [json.loads(item) for item in client.lrange(f"lowest:seen:{key}", 0, -1)]
        assert seen == [expected, expected]  # the first attempt and its retry

        client.set(f"lowest:fixed:{key}", 1)
        run([*celery, "dlq", "replay", str(row["id"]), "--reason", "fixed"], project, env)
        wait_for(
            lambda: client.llen(f"lowest:seen:{key}") == 3,
            timeout_s=30,
            message=lambda: f"the replay to run:\n{worker.log()[-2000:]}",
        )
        assert json.loads(client.lrange(f"lowest:seen:{key}", -1, -1)[0]) == expected
    finally:
        worker.stop()
        client.close()
