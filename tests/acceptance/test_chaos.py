"""The chaos soak's short form (``python -m bench.chaos``; docs/chaos.md).

2,000 jobs on real workers (one per queue, each with its profile), a private
``redis-server --appendonly yes`` and a private PostgreSQL database behind a TCP proxy,
while workers and pool processes are SIGKILLed, Redis is restarted and the database is
cut. The soak itself checks the accounting invariant and exits non-zero unless it holds;
this test runs it as a subprocess with a deadline and reads its verdict and figures.
``JOBS_LONG_TESTS=1`` runs the long form (20,000 jobs, as ``make chaos`` does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("JOBS_LONG_TESTS") == "1"
JOBS = 20_000 if LONG else 2_000
#: The short form takes about 90 s on 2 busy cores (fleet start, 50 s of load, the drain).
DEADLINE_S = 2400 if LONG else 420
INVARIANTS = (
    "every job succeeded or was dead-lettered, none lost, none both",
    "attempts within max_retries + 1, redeliveries apart",
    "no guarded side effect happened twice",
    "each dead letter exactly once",
    "every job ended as planned, every beat slot ran once",
)

pytestmark = [pytest.mark.acceptance, pytest.mark.slow]


def run_soak(results: Path) -> tuple[int, str]:
    command = [
        sys.executable,
        "-m",
        "bench.chaos",
        "--jobs",
        str(JOBS),
        "--rate",
        "60" if LONG else "40",
        "--fault-every",
        "4",
        "--drain-timeout",
        "150",
        "--results",
        str(results),
    ]
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = proc.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        # SIGINT lets the soak stop its workers, redis-server and database; SIGKILL would not.
        proc.send_signal(signal.SIGINT)
        try:
            output, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            output, _ = proc.communicate()
        pytest.fail(f"the soak did not finish within {DEADLINE_S} s:\n{output[-6000:]}")
    return proc.returncode, output


@pytest.mark.timeout(DEADLINE_S + 180)
def test_chaos_soak_keeps_the_accounting_invariant(tmp_path: Path) -> None:
    results = tmp_path / "chaos.json"
    code, output = run_soak(results)

    verdict = "\n".join(line for line in output.splitlines() if line.startswith("INVARIANT"))
    assert code == 0, f"the soak failed:\n{verdict}\n\n{output[-4000:]}"
    for name in INVARIANTS:
        assert f"INVARIANT {name}: OK" in verdict, verdict
    assert "RESULT: PASS" in output
    report = json.loads(results.read_text())
    assert report["passed"] is True
    figures = report["figures"]
    # Not a vacuous pass: every job accounted for, and every kind of fault was injected.
    assert figures["jobs"] == JOBS
    assert figures["accounting"]["succeeded"] + figures["accounting"]["dead_lettered"] == (
        JOBS + figures["beat_runs"]
    )
    faults = figures["faults"]
    assert faults["worker_kills"] >= 1 and faults["pool_process_kills"] >= 1, faults
    assert faults["pool_process_sigterms"] >= 1, faults  # SIGTERMs mixed into the kills
    assert faults["redis_restarts"] == 1 and faults["db_cuts"] == 1, faults
    assert figures["beat_runs"] > 0
    assert figures["dead_letters"]["by_reason"].get("permanent", 0) > 0
