"""``celery -A APP health`` as a real subprocess, one failing cause at a time (no workers).

Each test selects the checks it is about (``--check``): the broker-side ones run against a
private redis-server, so nothing here leaves a message where a later test's worker could
consume it. The checks that need workers (consumers, canary) are in
tests/acceptance/test_health.py.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobs_platform import create_app, history
from jobs_platform.clock import utc_iso, utcnow
from jobs_platform.health.keys import beat_ticks_key
from jobs_platform.testing import RedisServer, dead_letter, free_port, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.support.health_app"


@pytest.fixture(scope="module")
def broker() -> Iterator[str]:
    with RedisServer() as server:
        yield server.url


@pytest.fixture()
def client(broker: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(broker, decode_responses=True)
    conn.flushdb()
    yield conn
    conn.close()


@pytest.fixture()
def sqlite_file(tmp_path: Path) -> str:
    import sqlite3

    path = tmp_path / "jobs.sqlite3"
    sqlite3.connect(path).close()
    return f"sqlite:///{path}"


def health(
    broker_url: str, database_url: str, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "health", *args],
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "JOBS_BROKER_URL": broker_url,
            "JOBS_DATABASE_URL": database_url,
            **(env or {}),
        },
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done, time.monotonic() - start


def lines(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """Check name -> its whole line (``ok   name: detail`` / ``FAIL name: detail``)."""
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith(("ok ", "FAIL ")):
            out[line[5:].split(": ", 1)[0]] = line
    return out


# -- broker ------------------------------------------------------------------------------------


def test_an_unreachable_broker_fails_at_once_with_the_password_masked(sqlite_file: str) -> None:
    dead = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    done, took = health(dead, sqlite_file, "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert not checks["broker"]["ok"]
    assert "redis://:***@127.0.0.1" in checks["broker"]["detail"]
    assert "Connection refused" in checks["broker"]["detail"]
    assert "s3cret" not in done.stdout + done.stderr
    assert checks["database"]["ok"]
    others = [c for name, c in checks.items() if name not in ("broker", "database")]
    assert len(others) == 12  # consumers, canary, backlog x 3 queues; beat; spool; breakers
    assert all(c["detail"] == "not checked: the broker does not answer" for c in others)
    print(f"\nbroker down: verdict in {report['elapsed_s']:.2f} s ({took:.2f} s wall)")

    # Without the broker's own line, each skipped check says why.
    done, _ = health(dead, sqlite_file, "--check", "beat")
    assert done.returncode == 1
    assert done.stdout.startswith(
        "FAIL beat: not checked: the broker does not answer (redis://:***@127.0.0.1:"
    )
    assert "Connection refused" in done.stdout and "s3cret" not in done.stdout


def test_a_black_holed_broker_fails_within_the_ping_timeout(sqlite_file: str) -> None:
    # Accepts the TCP connection (kernel backlog) and never answers, as a hung Redis would.
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        url = f"redis://127.0.0.1:{hole.getsockname()[1]}/0"
        # The ping gets min(1 s, 20% of --timeout): with 60 s, a ping given its 20% (12 s) or
        # the whole deadline would be far from its own 1 s, so the bound below tells them apart.
        checks = ("--check", "broker", "--check", "spool", "--timeout", "60")
        done, _ = health(url, sqlite_file, "--json", *checks)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    broker, spool = report["checks"]
    assert not broker["ok"] and "Timeout" in broker["detail"]
    # The ping's own 1 s timeout ended it. elapsed_s is the command's own measure of the ping
    # (seen 1.0 s); 10 s leaves a loaded machine 9 s of slack and is below both of the above.
    assert broker["elapsed_s"] < 10, broker
    assert spool["detail"] == "not checked: the broker does not answer"


# -- database ----------------------------------------------------------------------------------


def test_a_reachable_database_passes_postgresql_and_sqlite(
    broker: str, pg_url: str, sqlite_file: str
) -> None:
    for url in (pg_url, sqlite_file):
        done, _ = health(broker, url, "--check", "database")
        assert done.returncode == 0, done.stdout
        assert done.stdout.startswith("ok   database: ")
        assert "answered SELECT 1 in" in done.stdout


@pytest.mark.parametrize("cut", ["dead_port", "directory", "missing_file"])
def test_a_cut_database_fails(broker: str, tmp_path: Path, cut: str) -> None:
    url = {
        "dead_port": f"postgresql+psycopg://postgres:pw@127.0.0.1:{free_port()}/jobs",
        # exists, but SQLite cannot open it: the SELECT 1 itself fails
        "directory": f"sqlite:///{tmp_path}",
        "missing_file": f"sqlite:///{tmp_path}/nowhere/jobs.sqlite3",
    }[cut]
    done, _ = health(broker, url, "--check", "database")
    assert done.returncode == 1
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("FAIL database: ")]
    expected = {
        "dead_port": "does not answer: OperationalError: connection failed",
        "directory": "does not answer: OperationalError: unable to open database file",
        "missing_file": "no database file at",
    }[cut]
    assert expected in line
    assert ":pw@" not in done.stdout
    assert not (tmp_path / "nowhere").exists()  # the check created nothing


def test_a_black_holed_database_fails_at_the_timeout(broker: str) -> None:
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(8)
        url = f"postgresql+psycopg://postgres@127.0.0.1:{hole.getsockname()[1]}/jobs"
        done, took = health(broker, url, "--check", "database", "--timeout", "2")
    assert done.returncode == 1
    # The verdict names the timeout that ended the wait (the run itself has a deadline).
    assert done.stdout.startswith("FAIL database: no answer within the 2 s timeout")
    print(f"\nblack-holed database: `health` took {took:.2f} s wall")


# -- dead-letter spool -------------------------------------------------------------------------


def test_a_spool_that_does_not_drain_fails_with_its_depth(
    broker: str, client: redis.Redis, sqlite_file: str
) -> None:
    key = f"jptest:spool:{uuid.uuid4().hex}"
    env = {"JOBS_DLQ_SPOOL_KEY": key}
    done, _ = health(broker, sqlite_file, "--check", "spool", env=env)
    assert (done.returncode, done.stdout.splitlines()[0]) == (0, "ok   spool: empty")

    client.rpush(key, dead_letter(failed_at=utcnow()).to_json())
    done, _ = health(broker, sqlite_file, "--check", "spool", env=env)
    assert done.returncode == 0  # a letter on its way to the database
    assert "1 dead letter(s) in the spool" in done.stdout

    # Left behind by drainers that cannot write (the database is down): oldest first.
    stale = dead_letter(failed_at=utcnow() - dt.timedelta(minutes=10)).to_json()
    client.lpush(key, stale)
    done, _ = health(broker, sqlite_file, "--check", "spool", env=env)
    assert done.returncode == 1
    assert re.match(
        r"FAIL spool: not draining: 2 dead letter\(s\) in the spool, the oldest waiting 60\d s",
        done.stdout,
    )


def test_a_dead_letter_the_database_refused_fails_the_spool_check_naming_the_cause(
    broker: str, client: redis.Redis, sqlite_file: str
) -> None:
    """The spool's rejected list used to leave ``health --check spool`` ok."""
    from jobs_platform import db
    from jobs_platform.deadletter.sink import DeadLetterSink

    key = f"jptest:sp:{uuid.uuid4().hex[:8]}"
    db.upgrade(sqlite_file)
    app = create_app("refused", broker_url=broker, database_url=sqlite_file, dlq_spool_key=key)
    sink = DeadLetterSink(app.jobs_settings)
    refused = dead_letter(task_name="billing.charge", reason="no-such-reason")  # CHECK fails
    assert sink.capture(refused) is None
    assert client.llen(f"{key}:rejected") == 1 and client.llen(key) == 0  # set aside, kept
    db.engine_for(sqlite_file).dispose()

    done, _ = health(broker, sqlite_file, "--check", "spool", env={"JOBS_DLQ_SPOOL_KEY": key})
    assert done.returncode == 1, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first == (
        f"FAIL spool: 1 dead letter(s) the database refused for good, in {key}:rejected "
        f"(ops/runbooks/dead-letter-set-aside.md); the latest: "
        f"billing.charge[{refused.task_id}]: IntegrityError: CHECK constraint failed: "
        "ck_dead_letter_jobs_ck_dead_letter_jobs_reason"
    ), first


# -- beat --------------------------------------------------------------------------------------


def test_beat_silent_with_a_schedule_fails(
    broker: str, client: redis.Redis, sqlite_file: str
) -> None:
    done, _ = health(broker, sqlite_file, "--check", "beat")
    assert done.returncode == 0
    assert "ok   beat: no beat schedule in this app" in done.stdout

    scheduled = {"JPTEST_HEALTH_BEAT": "1"}  # one entry every second: bound 2 x 1 + 10 s
    done, _ = health(broker, sqlite_file, "--check", "beat", env=scheduled)
    assert done.returncode == 1
    assert "FAIL beat: beat has never ticked (no tick at all)" in done.stdout

    client.hset(beat_ticks_key(), "tick", utc_iso(utcnow() - dt.timedelta(seconds=30)))
    done, _ = health(broker, sqlite_file, "--check", "beat", env=scheduled)
    assert done.returncode == 1
    assert re.match(
        r"FAIL beat: beat is silent: newest tick 3\d s ago \(tick\), bound 12 s", done.stdout
    )

    client.hset(beat_ticks_key(), "tick", utc_iso(utcnow()))
    done, _ = health(broker, sqlite_file, "--check", "beat", env=scheduled)
    assert done.returncode == 0, done.stdout


def test_a_running_beat_passes(
    broker: str, client: redis.Redis, sqlite_file: str, tmp_path: Path
) -> None:
    """The platform's own beat writes the ticks this check reads (the key names agree)."""
    from jobs_platform.schedule import SCHEDULER

    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JOBS_BROKER_URL": broker,
        "JOBS_DATABASE_URL": sqlite_file,
        "JPTEST_HEALTH_BEAT": "1",
    }
    with (tmp_path / "beat.log").open("wb") as log:
        beat = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                APP,
                "beat",
                "-S",
                SCHEDULER,
                "--max-interval",
                "1",
                "-s",
                str(tmp_path / "schedule"),
            ],
            env=env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: health(broker, sqlite_file, "--check", "beat", env=env)[0].returncode == 0,
            timeout_s=30,
            interval_s=0.2,
            message=lambda: "beat to tick:\n" + (tmp_path / "beat.log").read_text()[-2000:],
        )
    finally:
        beat.terminate()
        beat.wait(20)
    assert client.hlen(beat_ticks_key()) >= 1


# -- oldest waiting job ------------------------------------------------------------------------


def test_a_job_waiting_past_its_queues_objective_fails(
    broker: str, client: redis.Redis, sqlite_file: str
) -> None:
    producer = create_app("healthproducer", broker_url=broker)
    old = utc_iso(utcnow() - dt.timedelta(hours=2))
    # Nobody consumes this Redis: a real message with an old stamp, in a priority
    # sub-list (kombu keeps one list per priority step; LLEN heavy alone misses it).
    producer.send_task(
        "health.noop", queue="heavy", priority=6, headers={history.ENQUEUED_HEADER: old}
    )
    producer.send_task("health.noop", queue="fast", headers={history.ENQUEUED_HEADER: utc_iso()})
    assert client.llen("heavy") == 0 and client.llen("heavy\x06\x166") == 1

    done, _ = health(broker, sqlite_file, "--check", "backlog")
    assert done.returncode == 1
    by_name = lines(done)
    assert re.match(
        r"FAIL backlog:heavy: oldest waiting job 720\d s old, objective 900 s \(1 waiting\)",
        by_name["backlog:heavy"],
    )
    assert by_name["backlog:fast"].startswith("ok   backlog:fast: 1 waiting, oldest ")
    assert by_name["backlog:thirdparty"] == "ok   backlog:thirdparty: empty (objective 300 s)"

    done, _ = health(broker, sqlite_file, "--check", "backlog", "--queue", "fast")
    assert done.returncode == 0  # a fast worker's container checks only its own queue
    assert "heavy" not in done.stdout
