"""The real ``celery -A APP delayed ...`` command, as a subprocess, on a Redis of its own.

Exit codes as ``dlq``: 0 done, 1 refused (an id not, or no longer, delayed), 2 usage.
``--json`` stdout stays JSON Lines; messages go to stderr. Ids and task names never wrap.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from jobs_platform.brokers.redis import delayed as store
from jobs_platform.brokers.redis import options
from jobs_platform.testing import RedisServer
from tests.support.delayed_app import declare, make_app

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.support.delayed_app"
LONG_TASK = "myproj.billing.reminders.remind_enterprise_customer_about_renewal"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture()
def seeded(server: RedisServer) -> SimpleNamespace:
    """Four delayed jobs: in 1 h, 2 h, 3 h (``remind``, long name, priority 9) and 2 days."""
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    app = make_app(broker_url=server.url)
    tasks = declare(app)

    @app.task(name=LONG_TASK, time_limit=2)
    def remind(customer: int, api_key: str = "") -> None:
        """Never runs here: no worker."""

    def later(task: Any, seconds: float, *args: Any, **opts: Any) -> str:
        return str(task.apply_async(args, countdown=seconds, ignore_result=True, **opts).id)

    return SimpleNamespace(
        client=client,
        keys=options.keys_for(app),
        hour=later(tasks.record_run, 3600, "a"),
        two_hours=later(tasks.record_run, 7200, "b"),
        remind=str(
            remind.apply_async(
                (42,), {"api_key": "s3cret"}, countdown=3 * 3600, priority=9, ignore_result=True
            ).id
        ),
        days=later(tasks.record_run, 2 * 86400, "c"),
        env={
            **{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")},
            "JOBS_BROKER_URL": server.url,
            "PYTHONPATH": str(ROOT),
        },
    )


def cli(seeded: SimpleNamespace, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "delayed", *args],
        env={**seeded.env, **env},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_list_json_is_soonest_first_with_filters(seeded: SimpleNamespace) -> None:
    done = cli(seeded, "list", "--json")
    assert done.returncode == 0, done.stderr
    rows = json_lines(done.stdout)
    ids = [seeded.hour, seeded.two_hours, seeded.remind, seeded.days]
    assert [r["task_id"] for r in rows] == ids
    head = rows[2]
    assert (head["task_name"], head["queue"], head["priority"]) == (LONG_TASK, "fast", 9)
    assert head["list"] == "fast\x06\x169"
    due = dt.datetime.fromisoformat(head["due_at"])
    assert abs((due - dt.datetime.now(dt.UTC)).total_seconds() - 3 * 3600) < 60

    def selected(*args: str) -> list[str]:
        result = cli(seeded, "list", "--json", *args)
        assert result.returncode == 0, result.stderr
        return [r["task_id"] for r in json_lines(result.stdout)]

    assert selected("--task", LONG_TASK) == [seeded.remind]
    assert selected("--queue", "heavy") == []
    assert selected("--due-before", "150m") == [seeded.hour, seeded.two_hours]
    assert selected("--due-after", "150m", "--due-before", "1d") == [seeded.remind]
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    assert selected("--due-after", later) == [seeded.days]
    assert selected("--limit", "1") == [seeded.hour]


def test_show_decodes_the_arguments_and_masks_secrets(seeded: SimpleNamespace) -> None:
    done = cli(seeded, "show", seeded.remind, "--json")
    assert done.returncode == 0, done.stderr
    [row] = json_lines(done.stdout)
    assert row["args"] == [42]
    assert row["kwargs"] == {"api_key": "***"} and row["redacted"] is True
    assert "s3cret" not in done.stdout  # nor in argsrepr/kwargsrepr: those are left out
    assert row["headers"]["id"] == seeded.remind and row["headers"]["timelimit"] == [2, None]
    human = cli(seeded, "show", seeded.remind)
    assert human.returncode == 0 and "s3cret" not in human.stdout
    assert LONG_TASK in human.stdout and "masked" in human.stdout
    missing = cli(seeded, "show", "no-such-id")
    assert missing.returncode == 1 and "not delayed" in missing.stderr


def test_cancel_needs_a_reason_and_refuses_ids_that_are_not_delayed(
    seeded: SimpleNamespace,
) -> None:
    usage = cli(seeded, "cancel", seeded.hour)
    assert usage.returncode == 2 and "--reason" in usage.stderr
    assert cli(seeded, "cancel", seeded.hour, "--reason", "  ").returncode == 2
    assert store.get(seeded.client, seeded.keys, seeded.hour) is not None

    done = cli(seeded, "cancel", seeded.hour, "gone", "--reason", "INC-7 customer left", "--json")
    assert done.returncode == 1
    assert json_lines(done.stdout) == [
        {"task_id": seeded.hour, "outcome": "cancelled", "task_name": "delayed.record_run"},
        {"task_id": "gone", "outcome": "not_delayed"},
    ]
    assert "gone: not delayed" in done.stderr and "1 of 2 refused" in done.stderr
    assert store.get(seeded.client, seeded.keys, seeded.hour) is None
    again = cli(seeded, "cancel", seeded.hour, "--reason", "twice")
    assert again.returncode == 1 and "not delayed" in again.stderr
    ok = cli(seeded, "cancel", seeded.days, "--reason", "INC-8")
    assert ok.returncode == 0, ok.stderr
    assert f"{seeded.days}: cancelled" in ok.stdout
    assert store.count(seeded.client, seeded.keys) == 2


def test_bad_times_are_usage_errors(seeded: SimpleNamespace) -> None:
    done = cli(seeded, "list", "--due-before", "soonish")
    assert done.returncode == 2 and "duration" in done.stderr


def unbroken(text: str, *needles: str) -> None:
    for needle in needles:
        assert any(needle in line for line in text.splitlines()), f"{needle!r} broken:\n{text}"


def test_piped_tables_never_break_ids_or_task_names(seeded: SimpleNamespace) -> None:
    done = cli(seeded, "list", COLUMNS="60")
    assert done.returncode == 0, done.stderr
    unbroken(done.stdout, LONG_TASK, seeded.remind, seeded.days)
    assert "4 shown of 4 waiting" in done.stdout


def test_a_narrow_terminal_never_breaks_ids_or_task_names(seeded: SimpleNamespace) -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 60, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", APP, "delayed", "list"],
        env={**seeded.env, "TERM": "xterm-256color"},
        cwd=str(ROOT),
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the command exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    screen = ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")
    unbroken(screen, LONG_TASK, seeded.remind)
