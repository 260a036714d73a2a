"""``celery -A APP batch list|show|cancel`` on the real PostgreSQL and SQLite: batches in each
status (running, succeeded, failed = settled with dead members, cancelled), seeded through
the counting transaction and the dead-letter store as workers record them. In-process
through click, and the real ``celery`` command as a subprocess for ``show --json``, for
``--watch`` (a thread settles the batch meanwhile) and for bytes that are not UTF-8."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result

from jobs_platform import create_app, history
from jobs_platform.batches import counting, state
from jobs_platform.batches.model import batches, members
from jobs_platform.cli.batch import batch as batch_group
from jobs_platform.db import engine_for, upgrade
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.store import TABLE, DeadLetterStore
from jobs_platform.outbox.model import job_outbox
from jobs_platform.testing import wait_for
from tests.support.guards import NO_BROKER

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CELERY_BATCH = [sys.executable, "-m", "celery", "-A", "tests.support.batch_app", "batch"]
COUNTS = ("total", "pending", "succeeded", "dead", "cancelled")
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    with engine_for(url).begin() as conn:
        for table in (job_outbox, members, batches, TABLE):
            conn.execute(sa.delete(table))
    return url


@pytest.fixture()
def app(db_url: str) -> Any:
    return create_app("batchcli", database_url=db_url, broker_url=NO_BROKER)


def run(app: Any, *args: str) -> Result:
    return CliRunner().invoke(batch_group, list(args), obj=SimpleNamespace(app=app))


def make(url: str, total: int, name: str, minutes: int) -> str:
    batch_id = str(uuid.uuid4())
    with engine_for(url).begin() as conn:
        counting.create(conn, batch_id, name, total, {}, now=T0 + dt.timedelta(minutes=minutes))
    return batch_id


def record(url: str, batch_id: str, member: str, outcome: str) -> None:
    with engine_for(url).begin() as conn:
        assert counting.record(conn, batch_id, member, outcome) is not None


def die(url: str, batch_id: str, member: str) -> int:
    """The member dead-lettered as a worker does it: the letter and the count, one commit."""
    row_id = DeadLetterStore(url).add(
        DeadLetter(
            task_id=member,
            task_name="t.member",
            queue="fast",
            reason="exhausted",
            args=[],
            kwargs={},
            headers={history.BATCH_HEADER: batch_id},
            errors=[{"type": "x.Boom", "message": "boom", "attempt": 1}],
            failed_at=T0,
            chain="chain-" + member,
        )
    )
    assert row_id is not None
    return row_id


@pytest.fixture()
def seeded(db_url: str) -> dict[str, Any]:
    """One batch of each status; ``letters``: the failed batch's {member: dead letter id}."""
    running = make(db_url, 3, "running one", 1)
    record(db_url, running, "r1", "succeeded")
    succeeded = make(db_url, 2, "all good", 2)
    for m in ("s1", "s2"):
        record(db_url, succeeded, m, "succeeded")
    failed = make(db_url, 4, "some died", 3)
    record(db_url, failed, "f1", "succeeded")
    record(db_url, failed, "f2", "succeeded")
    letters = {m: die(db_url, failed, m) for m in ("f3", "f4")}
    cancelled = make(db_url, 3, "stopped", 4)
    with engine_for(db_url).begin() as conn:
        assert counting.cancel(conn, cancelled, "wrong file")
    record(db_url, cancelled, "c1", "succeeded")  # it was running: it finished
    record(db_url, cancelled, "c2", "cancelled")
    record(db_url, cancelled, "c3", "cancelled")
    return {
        "running": running,
        "succeeded": succeeded,
        "failed": failed,
        "cancelled": cancelled,
        "letters": letters,
    }


EXPECTED = {  # total, pending, succeeded, dead, cancelled
    "running": (3, 2, 1, 0, 0),
    "succeeded": (2, 0, 2, 0, 0),
    "failed": (4, 0, 2, 2, 0),
    "cancelled": (3, 0, 1, 0, 2),
}


def shown(app: Any, batch_id: str) -> dict[str, Any]:
    done = run(app, "show", batch_id, "--json")
    assert done.exit_code == 0, done.output
    (line,) = done.stdout.splitlines()
    data: dict[str, Any] = json.loads(line)
    return data


def test_show_json_has_the_counts_and_status_of_each_kind_of_batch(
    app: Any, seeded: dict[str, Any]
) -> None:
    for status, counts in EXPECTED.items():
        data = shown(app, seeded[status])
        assert data["id"] == seeded[status] and data["status"] == status
        assert tuple(data[k] for k in COUNTS) == counts, status
        assert dt.datetime.fromisoformat(data["created_at"]).tzinfo is not None
    assert shown(app, seeded["running"])["completed_at"] is None
    assert shown(app, seeded["failed"])["failed_at"] is not None
    cancelled = shown(app, seeded["cancelled"])
    assert cancelled["cancel_reason"] == "wrong file" and cancelled["cancelled_at"] is not None


def test_dead_members_link_to_their_dead_letters(app: Any, seeded: dict[str, Any]) -> None:
    letters = seeded["letters"]
    assert shown(app, seeded["failed"])["dead_letters"] == letters
    assert shown(app, seeded["succeeded"])["dead_letters"] == {}
    text = run(app, "show", seeded["failed"])
    assert text.exit_code == 0, text.output
    assert f"batch {seeded['failed']} (some died): failed" in text.stdout
    assert "4 members: 0 pending, 2 succeeded, 2 dead, 0 cancelled" in text.stdout
    for member, letter in letters.items():
        assert f"dead member {member}: dead letter {letter} (celery -A APP dlq show {letter})" in (
            text.stdout
        )


def test_list_shows_every_batch_newest_first_and_filters_by_status(
    app: Any, seeded: dict[str, Any]
) -> None:
    done = run(app, "list", "--json")
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    order = ["cancelled", "failed", "succeeded", "running"]  # newest first
    assert [r["id"] for r in rows] == [seeded[s] for s in order]
    assert [r["status"] for r in rows] == order
    for r in rows:
        assert tuple(r[k] for k in COUNTS) == EXPECTED[r["status"]]
    for status in EXPECTED:
        only = run(app, "list", "--json", "--status", status)
        assert [json.loads(line)["id"] for line in only.stdout.splitlines()] == [seeded[status]]
    assert len(run(app, "list", "--json", "--limit", "2").stdout.splitlines()) == 2
    table = run(app, "list")
    assert table.exit_code == 0, table.output
    for name in ("running one", "all good", "some died", "stopped"):
        assert name in table.stdout


def test_members_a_broker_failure_left_unsent_make_the_batch_cancelled_not_succeeded(
    app: Any, db_url: str
) -> None:
    # create.py counts the unsent members cancelled without cancelling the batch: on_success
    # never fires for it, so `succeeded` would be a lie.
    batch_id = make(db_url, 2, "half sent", 0)
    record(db_url, batch_id, "m1", "succeeded")
    record(db_url, batch_id, "m2", "cancelled")
    assert shown(app, batch_id)["status"] == "cancelled"
    listed = run(app, "list", "--json", "--status", "succeeded")
    assert listed.exit_code == 0 and listed.stdout == ""


def test_an_unknown_id_exits_1_with_one_line(app: Any, seeded: dict[str, Any]) -> None:
    for args in (["show", "nope"], ["show", "nope", "--json"], ["cancel", "nope", "--reason", "x"]):
        done = run(app, *args)
        assert done.exit_code == 1, done.output
        assert done.stderr == "no batch 'nope'\n" and done.stdout == ""


@pytest.mark.parametrize("value", ["x\x00y", "\udcff", "caf\udce9"])
@pytest.mark.parametrize("command", ["show", "cancel", "cancel-reason"])
def test_text_no_database_can_hold_is_a_usage_error(
    app: Any, seeded: dict[str, Any], command: str, value: str
) -> None:
    if command == "cancel-reason":
        done = run(app, "cancel", seeded["running"], "--reason", value)
        assert "--reason" in done.output
    else:
        extra = ["--reason", "x"] if command == "cancel" else []
        done = run(app, command, value, *extra)
        assert "BATCH_ID" in done.output
    assert done.exit_code == 2, (done.output, done.exception)
    assert shown(app, seeded["running"])["status"] == "running"


def test_a_name_with_markup_and_control_characters_prints_as_text(app: Any, db_url: str) -> None:
    batch_id = make(db_url, 1, "[/b] \x1b[2J import", 0)
    text = run(app, "show", batch_id)
    assert text.exit_code == 0, text.output
    assert "([/b] \\x1b[2J import): running" in text.stdout
    settle = threading.Timer(0.3, record, (db_url, batch_id, "m1", "succeeded"))
    settle.start()
    watched = run(app, "show", batch_id, "--watch", "--interval", "0.05")
    settle.join()
    assert watched.exit_code == 0, (watched.output, watched.exception)
    assert "[/b] \\x1b[2J import" in watched.stderr and "1/1" in watched.stderr


def test_watch_ends_by_itself_when_the_batch_settles(
    app: Any, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = make(db_url, 40, "watched", 0)
    reads: list[int] = []
    polled = threading.Condition()
    read = state.get

    def counted(*args: Any, **kwargs: Any) -> Any:
        found = read(*args, **kwargs)
        assert found is not None
        with polled:
            reads.append(found.pending)
            polled.notify_all()
        return found

    monkeypatch.setattr(state, "get", counted)

    def read_since(seen: int) -> None:
        with polled:
            polled.wait_for(lambda: len(reads) > seen, timeout=30)

    def settle() -> None:  # half after the watch's first read, the rest after a later one
        for part in (range(20), range(20, 40)):
            with polled:
                seen = len(reads)
            read_since(seen)
            for i in part:
                record(db_url, batch_id, f"m{i}", "dead" if i == 7 else "succeeded")

    thread = threading.Thread(target=settle)
    thread.start()
    done = run(app, "show", batch_id, "--watch", "--interval", "0.02", "--json")
    thread.join(30)
    assert done.exit_code == 0, (done.output, done.exception)
    assert reads[0] == 40 and reads[-1] == 0 and len(reads) >= 3  # it watched, then ended
    data = json.loads(done.stdout)
    assert (data["status"], data["pending"], data["succeeded"], data["dead"]) == (
        "failed",
        0,
        39,
        1,
    )
    assert "40/40" in done.stderr and "39 ok, 1 dead, 0 cancelled" in done.stderr
    assert "━" in done.stderr  # the bar


# -- the real command ----------------------------------------------------------------------------


def celery_env(url: str) -> dict[str, str]:
    return {
        **{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")},
        "JOBS_BROKER_URL": NO_BROKER,
        "JOBS_DATABASE_URL": url,
        "PYTHONPATH": str(ROOT),
    }


def test_the_real_command_shows_a_batch_and_refuses_an_unknown_one(
    db_url: str, seeded: dict[str, Any]
) -> None:
    done = subprocess.run(
        [*CELERY_BATCH, "show", seeded["failed"], "--json"],
        env=celery_env(db_url), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["status"], *(data[k] for k in COUNTS)) == ("failed", *EXPECTED["failed"])
    assert data["dead_letters"] == {m: i for m, i in seeded["letters"].items()}
    missing = subprocess.run(
        [*CELERY_BATCH, "show", "nope"],
        env=celery_env(db_url), cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (missing.returncode, missing.stderr, missing.stdout) == (1, "no batch 'nope'\n", "")


def test_the_real_watch_ends_when_the_batch_settles(db_url: str) -> None:
    batch_id = make(db_url, 3, "watched for real", 0)
    proc = subprocess.Popen(
        [*CELERY_BATCH, "show", batch_id, "--watch", "--interval", "0.1"],
        env=celery_env(db_url), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        record(db_url, batch_id, "m0", "succeeded")
        record(db_url, batch_id, "m1", "succeeded")
        assert proc.poll() is None  # 1 pending: still watching
        record(db_url, batch_id, "m2", "cancelled")
        wait_for(lambda: proc.poll() is not None, timeout_s=30)
        out, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"batch {batch_id} (watched for real): cancelled" in out
    assert "3/3" in err and "2 ok, 0 dead, 1 cancelled" in err


def test_the_real_command_refuses_an_id_that_is_not_utf8(db_url: str) -> None:
    done = subprocess.run(
        [*map(os.fsencode, CELERY_BATCH), b"show", b"caf\xe9"],
        env=celery_env(db_url), cwd=ROOT, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, stderr
    assert "BATCH_ID" in stderr and "not valid UTF-8" in stderr and "Traceback" not in stderr
