"""The real ``celery -A APP dlq ...`` command, as a subprocess, on SQLite and PostgreSQL.

Exit codes: 0 when everything asked was done, 1 when any row was refused (the others are
still processed), 2 for usage errors. Messages go to stderr; ``--json`` stdout stays JSON
Lines. Tables never break an id, a task name or a fingerprint, on a terminal or piped.
``dlq drain`` says what its own pass did, whatever a worker's drainer does meanwhile.
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
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import sqlalchemy.exc
from click.testing import CliRunner

from jobs_platform import create_app, db
from jobs_platform.cli.dlq import dlq
from jobs_platform.deadletter.drainer import Drained, Drainer
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.sink import DeadLetterSink, sink_for
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import RedisServer, free_port
from tests.conftest import fresh_pg_database

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.support.dlq_app"
LONG_TASK = "myproj.billing.tasks.charge_invoice_for_enterprise_customer"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('clidb')}/jobs.sqlite3"
        db.upgrade(url)
        yield url
        return
    with fresh_pg_database() as url:
        db.upgrade(url)
        yield url


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    # Replays publish to "fast": on a broker of our own, no worker of this session runs them.
    with RedisServer() as server:
        yield server.url


class Cli:
    """``celery -A tests.support.dlq_app dlq ...`` against one database."""

    def __init__(self, database_url: str, redis_url: str) -> None:
        self.store = DeadLetterStore(database_url)
        self.env = {
            **{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")},
            "JOBS_BROKER_URL": redis_url,
            "JOBS_DATABASE_URL": database_url,
            "PYTHONPATH": str(ROOT),
        }

    def __call__(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "dlq", *args],
            env={**self.env, **env},
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def seed(
        self, task: str, *, reason: str = "exhausted", redacted: bool = False, queue: str = "fast"
    ) -> int:
        row_id = self.store.add(
            DeadLetter(
                reason=reason,
                task_id=str(uuid.uuid4()),
                task_name=task,
                queue=queue,
                errors=[
                    {
                        "type": "partner.errors.PartnerTimeoutError",
                        "message": "the partner did not answer within 30 seconds while "
                        "charging invoice INV-2024-000123 for customer acme",
                        "at": "2026-01-02T03:04:05+00:00",
                        "attempt": 1,
                    }
                ],
                failed_at=dt.datetime.now(dt.UTC),
                args=[1],
                kwargs={"password": "***"} if redacted else {},
                attempts=1,
                chain=uuid.uuid4().hex,
                redacted=redacted,
            )
        )
        assert row_id is not None
        return row_id

    def spool(self, key: str) -> redis.Redis:
        client: redis.Redis = redis.Redis.from_url(self.env["JOBS_BROKER_URL"])
        client.delete(key, f"{key}:rejected", f"{key}:unreadable")
        return client

    def status(self, row_id: int) -> str:
        row = self.store.get(row_id)
        assert row is not None
        return str(row["status"])


@pytest.fixture()
def cli(database: str, broker: str) -> Cli:
    return Cli(database, broker)


def task_name() -> str:
    return f"t{uuid.uuid4().hex[:8]}.job"


def json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def spooled(task: str, **overrides: Any) -> DeadLetter:
    """A dead letter as a worker spools it when the database is down."""
    values: dict[str, Any] = {
        "reason": "exhausted",
        "task_id": str(uuid.uuid4()),
        "task_name": task,
        "queue": "fast",
        "errors": [{"type": "E", "message": "down", "at": "t", "attempt": 1}],
        "failed_at": dt.datetime.now(dt.UTC),
        "args": [1],
        "kwargs": {},
        "attempts": 1,
        "chain": uuid.uuid4().hex,
    }
    return DeadLetter(**{**values, **overrides})


# -- every refusal exits non-zero -----------------------------------------------------------


def test_replay_of_a_redacted_row_is_refused_with_exit_1(cli: Cli) -> None:
    row_id = cli.seed(task_name(), redacted=True)
    for extra in ((), ("--dry-run",)):
        done = cli("replay", str(row_id), "--reason", "INC-1 fixed", *extra)
        assert done.returncode == 1, (extra, done.stdout, done.stderr)
        assert "redacted" in done.stderr and "--allow-redacted" in done.stderr
        assert "1 of 1 refused" in done.stderr
    done = cli("replay", str(row_id), "--reason", "INC-1 fixed", "--json")
    assert done.returncode == 1, done.stderr
    [line] = json_lines(done.stdout)  # stdout stays JSON Lines
    assert (line["id"], line["outcome"]) == (row_id, "refused")
    assert cli.status(row_id) == "dead"

    allowed = cli("replay", str(row_id), "--reason", "INC-1 fixed", "--allow-redacted", "--json")
    assert allowed.returncode == 0, allowed.stderr
    assert json_lines(allowed.stdout)[0]["outcome"] == "replayed"
    assert cli.status(row_id) == "replayed"


def test_replay_of_a_missing_or_resolved_row_exits_1(cli: Cli) -> None:
    row_id = cli.seed(task_name())
    cli.store.discard([row_id], reason="dup", actor="ann")
    done = cli("replay", str(row_id), "999999999", "--reason", "INC-2", "--json")
    assert done.returncode == 1, done.stderr
    assert json_lines(done.stdout) == [
        {"id": row_id, "outcome": "already_resolved"},
        {"id": 999999999, "outcome": "missing"},
    ]
    assert "2 of 2 refused" in done.stderr


def test_bulk_replay_processes_the_rest_and_says_how_many_were_refused(cli: Cli) -> None:
    task = task_name()
    ok = [cli.seed(task), cli.seed(task)]
    secret = cli.seed(task, redacted=True)
    done = cli("replay", "--task", task, "--reason", "INC-3 fixed", "--rate", "100", "--json")
    assert done.returncode == 1, done.stderr
    outcomes = {line["id"]: line["outcome"] for line in json_lines(done.stdout)}
    assert outcomes == {ok[0]: "replayed", ok[1]: "replayed", secret: "refused"}
    assert "1 of 3 refused" in done.stderr
    assert [cli.status(i) for i in (*ok, secret)] == ["replayed", "replayed", "dead"]

    human = cli("replay", str(secret), "--reason", "INC-3 fixed")
    assert human.returncode == 1
    assert f"{secret}: refused" in human.stderr and "refused" not in human.stdout
    assert "replay: 0 of 1 replayed" in human.stdout


def test_a_row_whose_queue_is_gone_is_refused_and_the_others_replay(cli: Cli) -> None:
    task = task_name()
    gone, ok = cli.seed(task, queue="retired-queue"), cli.seed(task)
    done = cli("replay", str(gone), str(ok), "--reason", "INC-4 fixed", "--rate", "100")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert f"{gone}: refused: its queue is not declared" in done.stderr
    assert f"{ok}: replayed" in done.stdout and "1 of 2 refused" in done.stderr
    assert [cli.status(gone), cli.status(ok)] == ["dead", "replayed"]


def test_a_broker_that_is_down_stops_the_replay_and_changes_nothing(cli: Cli) -> None:
    task = task_name()
    rows = [cli.seed(task), cli.seed(task)]
    down = f"redis://127.0.0.1:{free_port()}/0"
    done = cli("replay", "--task", task, "--reason", "INC-5", "--json", JOBS_BROKER_URL=down)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert [r["outcome"] for r in json_lines(done.stdout)] == ["failed", "not_attempted"]
    assert "2 of 2 refused" in done.stderr
    assert [cli.status(i) for i in rows] == ["dead", "dead"]


def test_discard_of_missing_or_resolved_ids_discards_the_rest_and_exits_1(cli: Cli) -> None:
    task = task_name()
    dead, resolved = cli.seed(task), cli.seed(task)
    cli.store.discard([resolved], reason="earlier", actor="ann")
    done = cli("discard", str(dead), str(resolved), "999999999", "--reason", "customer gone")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert cli.status(dead) == "discarded"
    assert f"{resolved}: already_resolved" in done.stderr
    assert "999999999: missing" in done.stderr
    assert "2 of 3 refused" in done.stderr
    assert "discarded 1 of 3" in done.stdout

    again = cli("discard", str(dead), "--reason", "customer gone", "--dry-run")
    assert again.returncode == 1 and f"{dead}: already_resolved" in again.stderr


def test_show_of_a_missing_row_and_a_missing_reason_are_refused(cli: Cli) -> None:
    row_id = cli.seed(task_name())
    missing = cli("show", "999999999")
    assert missing.returncode == 1 and "no dead letter 999999999" in missing.stderr
    no_reason = cli("replay", str(row_id))
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    blank = cli("discard", str(row_id), "--reason", "  ")
    assert blank.returncode == 2 and "--reason" in blank.stderr
    assert cli.status(row_id) == "dead"


# -- dlq drain says what it did ------------------------------------------------------------


def test_drain_reports_moved_refused_unreadable_and_left(cli: Cli) -> None:
    key = f"jptest:spool:{uuid.uuid4().hex}"
    spool = cli.spool(key)
    task = task_name()
    good = [spooled(task), spooled(task)]
    # A reason outside the CHECK constraint: the database refuses it for good.
    bad = spooled(task, reason="bogus")
    for text in (good[0].to_json(), bad.to_json(), "not a dead letter", good[1].to_json()):
        spool.rpush(key, text)
    done = cli("drain", JOBS_DLQ_SPOOL_KEY=key)
    assert done.returncode == 0, done.stderr
    assert f"moved 2 spooled dead letter(s) into the table; 0 left in the spool {key!r}" in (
        done.stdout
    )
    assert f"1 refused by the database for good, moved to {key}:rejected" in done.stderr
    assert f"1 not dead letters at all, moved to {key}:unreadable" in done.stderr
    assert [len(cli.store.by_task_id(str(g.task_id))) for g in good] == [1, 1]
    assert (spool.llen(key), spool.llen(f"{key}:rejected"), spool.llen(f"{key}:unreadable")) == (
        0,
        1,
        1,
    )


def test_drain_counts_its_own_pass_while_a_workers_drainer_runs(
    sqlite_url: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The old count (the :rejected list measured before and after) took the worker's
    # rejection for its own: "moved 1 of 2", "1 refused".
    key = f"jptest:spool:{uuid.uuid4().hex}"
    app = create_app("draintest", database_url=sqlite_url, broker_url=redis_url, dlq_spool_key=key)
    db.upgrade(sqlite_url)
    task = task_name()
    for item in (spooled(task), spooled(task)):
        redis_client.rpush(key, item.to_json())
    worker = Drainer(DeadLetterSink(app.jobs_settings, spool_url=redis_url))
    ours = sink_for(app)  # the sink `dlq drain` writes through
    add = ours.store.add
    ran: list[bool] = []

    def add_while_a_worker_drains(letter: DeadLetter) -> int | None:
        if not ran:
            ran.append(True)
            # Meanwhile a job dies with a value the database refuses, and a worker's
            # drainer (not ours) moves it aside, along with the entries ours is on.
            redis_client.rpush(key, spooled(task, reason="bogus").to_json())
            assert worker.drain() == Drained(moved=2, rejected=1)
        return add(letter)

    monkeypatch.setattr(ours.store, "add", add_while_a_worker_drains)
    done = CliRunner().invoke(dlq, ["drain"], obj=SimpleNamespace(app=app))
    assert done.exit_code == 0, (done.output, done.exception)
    assert ran and redis_client.llen(f"{key}:rejected") == 1  # the worker rejected one
    assert "moved 2 spooled dead letter(s) into the table; 0 left" in done.stdout
    assert "refused" not in done.stderr


def test_drain_with_the_database_down_mid_pass_says_so_and_exits_1(
    sqlite_url: str, redis_url: str, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = f"jptest:spool:{uuid.uuid4().hex}"
    app = create_app(
        "draindown",
        database_url=sqlite_url,
        broker_url=redis_url,
        dlq_spool_key=key,
        dlq_write_attempts=1,
    )
    db.upgrade(sqlite_url)
    task = task_name()
    for item in (spooled(task), spooled(task), spooled(task)):
        redis_client.rpush(key, item.to_json())
    ours = sink_for(app)
    add = ours.store.add
    calls: list[DeadLetter] = []

    def down_after_one(letter: DeadLetter) -> int | None:
        calls.append(letter)
        if len(calls) > 1:
            raise sqlalchemy.exc.OperationalError("INSERT", {}, ConnectionRefusedError())
        return add(letter)

    monkeypatch.setattr(ours.store, "add", down_after_one)
    done = CliRunner().invoke(dlq, ["drain"], obj=SimpleNamespace(app=app))
    assert done.exit_code == 1, done.output
    assert "Traceback" not in done.output
    assert "moved 1 spooled dead letter(s) into the table; 2 left" in done.stdout
    assert "the database failed, the rest waits in the spool" in done.stderr
    assert redis_client.llen(key) == 2


# -- one option name per meaning ----------------------------------------------------------


def test_failure_reason_filters_everywhere_and_reason_is_only_the_justification(
    cli: Cli,
) -> None:
    task = task_name()
    exhausted, permanent = cli.seed(task), cli.seed(task, reason="permanent")

    listed = cli("list", "--task", task, "--failure-reason", "permanent", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json_lines(listed.stdout)] == [permanent]
    stats = cli("stats", "--task", task, "--failure-reason", "permanent", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["total"] == 1

    # The old spelling of the filter is a usage error that names the new one.
    for command in ("list", "stats"):
        old = cli(command, "--task", task, "--reason", "exhausted")
        assert old.returncode == 2, (command, old.stdout, old.stderr)
        assert "--failure-reason exhausted" in old.stderr
    # A justification that is a failure reason was almost surely meant as the filter.
    for command in ("replay", "discard"):
        ambiguous = cli(command, "--task", task, "--reason", "permanent")
        assert ambiguous.returncode == 2, (command, ambiguous.stdout, ambiguous.stderr)
        assert "--failure-reason permanent" in ambiguous.stderr
    assert [cli.status(i) for i in (exhausted, permanent)] == ["dead", "dead"]

    dry = cli(
        "replay", "--task", task, "--failure-reason", "permanent", "--reason", "x", "--dry-run"
    )
    assert dry.returncode == 0, dry.stderr
    assert f"{permanent}: would_replay" in dry.stdout and str(exhausted) not in dry.stdout
    done = cli("discard", "--task", task, "--failure-reason", "exhausted", "--reason", "dup")
    assert done.returncode == 0, done.stderr
    assert [cli.status(i) for i in (exhausted, permanent)] == ["discarded", "dead"]


# -- tables never break ids, task names, fingerprints ------------------------------------


def unbroken(text: str, *needles: str) -> None:
    lines = text.splitlines()
    for needle in needles:
        assert any(needle in line for line in lines), f"{needle!r} broken in:\n{text}"


def run_in_terminal(cli: Cli, *args: str, columns: int = 80) -> tuple[int, str]:
    """Run the command on a pseudo-terminal ``columns`` wide; its exit code and screen text."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", APP, "dlq", *args],
        env={**cli.env, "TERM": "xterm-256color"},
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
        except OSError:  # EIO: the command exited and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    code = proc.wait(timeout=60)
    return code, ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


@pytest.fixture()
def long_row(sqlite_url: str, broker: str) -> tuple[Cli, int, str]:
    db.upgrade(sqlite_url)
    cli = Cli(sqlite_url, broker)
    row_id = cli.seed(LONG_TASK)
    row = cli.store.get(row_id)
    assert row is not None and len(row["fingerprint"]) == 16
    return cli, row_id, row["fingerprint"]


def test_piped_tables_at_80_columns_never_break_names_or_fingerprints(
    long_row: tuple[Cli, int, str],
) -> None:
    cli, row_id, fingerprint = long_row
    for args in (("list",), ("stats",), ("show", str(row_id))):
        done = cli(*args, COLUMNS="80")
        assert done.returncode == 0, done.stderr
        unbroken(done.stdout, LONG_TASK, fingerprint)
        assert "PartnerTimeoutError" in done.stdout


def test_tables_on_an_80_column_terminal_never_break_names_or_fingerprints(
    long_row: tuple[Cli, int, str],
) -> None:
    cli, row_id, fingerprint = long_row
    for args in (("list",), ("stats",), ("show", str(row_id))):
        code, screen = run_in_terminal(cli, *args)
        assert code == 0, screen
        unbroken(screen, LONG_TASK, fingerprint)
