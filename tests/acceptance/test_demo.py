"""``make demo``'s short form, end to end: ``python -m tasks.demo --short`` as a subprocess.

It runs in a directory of its own (the default SQLite file and the demo's files land there)
with the session's Redis as the user's (``JOBS_BROKER_URL``), and must exit 0 with the
report's sections, no duplicate charge, a valid PNG chart, no process of its own left
running, and nothing left in that Redis: it says which database it claimed there, and
flushes it.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from jobs_platform.testing import RedisServer, wait_for
from jobs_platform.testing.redis_db import server_url
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

SECTIONS = (
    "1. Jobs by outcome, per queue",
    "2. Retries and their waits",
    "3. Dead letters (from the dead_letter_jobs table)",
    "4. Charges vs orders",
    "5. A worker SIGKILLed mid-run",
    "6. A delayed job through the delayed store",
    "7. Beat: two beats, a 1-second entry, each slot sent once",
    "8. The warehouse's rate limit",
    "8b. A tenant storm on the heavy queue (fairness_key)",
    "8c. A 5,000-row CSV import as a batch of 500-row chunks",
    "8d. A partner outage absorbed by the circuit breaker",
    "Expectations",
    "Where to look next",
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def processes_with(marker: str) -> list[int]:
    """Processes whose environment contains ``marker`` (every process the demo starts
    inherits its JOBS_DEMO_DIR)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first one, right after the signature)."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13, "a PNG starts with its IHDR chunk"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@pytest.fixture()
def users_redis() -> Iterator[str]:
    """A Redis of the test's own standing for the user's, with the user's data in database
    0: the session's shared database also holds other tests' keys, which come and go (a
    killed worker's liveness key expiring, say) while the tour runs."""
    with RedisServer() as server:
        url = server.url  # database 0
        redis.Redis.from_url(url).set("myshop:sessions:42", "the user's own data")
        yield url


def test_the_short_tour_runs_reports_and_stops_everything(users_redis: str, tmp_path: Path) -> None:
    redis_url = users_redis
    demo_dir = tmp_path / "demo-files"
    env = {
        **os.environ,
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DEMO_DIR": str(demo_dir),
        "PYTHONPATH": str(ROOT),
        "COLUMNS": "200",  # the report's tables unwrapped
    }
    env.pop("JOBS_DATABASE_URL", None)  # the embedded default: a SQLite file in the cwd
    given = redis.Redis.from_url(redis_url)
    keys_before = set(given.keys("*"))
    run = subprocess.run(
        [sys.executable, "-m", "tasks.demo", "--short"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    output = run.stdout + run.stderr
    failures = [line for line in output.splitlines() if "✗" in line or "did not end" in line]
    assert run.returncode == 0, "\n".join(failures) + "\n...\n" + output[-6000:]

    # It says which Redis it used and whose: an empty database it claimed on the server it
    # was given (not the one given, which holds the user's keys), flushed at the end.
    said = " ".join(output.split())
    found = re.search(
        r"broker: database (\d+) of the Redis at (\S+) \(from JOBS_BROKER_URL\), empty when "
        r"the tour began and claimed for it; flushed at the end",
        said,
    )
    assert found, said[:1500]
    assert found[2] == server_url(redis_url) and "private" not in said.split("database:")[0]
    used = redis.Redis.from_url(f"{server_url(redis_url)}/{found[1]}")
    assert used.dbsize() == 0, f"the demo left {used.dbsize()} keys in database {found[1]}"
    assert set(given.keys("*")) == keys_before, "the demo wrote into the database it was given"
    assert "the broker was database " in said and "flushed at the end" in said

    for heading in SECTIONS:
        assert heading in output, f"no section {heading!r} in the report"
    assert "every expectation held" in output
    assert "0 charged twice" in output, "the gateway's own count must show no duplicate charge"
    assert "no job lost: every job sent ended" in output
    assert (tmp_path / "jobs_platform.sqlite3").exists(), "the embedded SQLite file, in the cwd"

    chart = demo_dir / "tour.png"
    assert str(chart) in output
    width, height = png_size(chart.read_bytes())
    assert width >= 600 and height >= 400

    marker = f"JOBS_DEMO_DIR={demo_dir}"
    # Everything it started is stopped before it exits; the kernel may take a moment to
    # reap the last pool processes of a SIGKILLed worker (orphans reparented to init).
    wait_for(
        lambda: not processes_with(marker),
        timeout_s=10,
        message=lambda: f"the demo's processes to be gone: {processes_with(marker)}",
    )
