"""A gevent worker's greenlets never freeze their process waiting on each other in SQLite.

SQLite's busy wait sleeps in C, and every greenlet of a gevent worker shares one OS
thread: a greenlet waiting for the write lock held by another greenlet of the same
process (suspended in its transaction, e.g. while publishing to Redis) stopped the whole
process for the 30-second busy timeout, and the thirdparty worker's consumer loop and
lease with it. The engine now hands its connections to one greenlet at a time
(:func:`jobs_platform.db._one_connection_at_a_time`). Runs in a child process: gevent's
patching must come before anything else is imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

#: Without the gate the second writer fails after the 30-second busy timeout and the hub
#: is frozen as long; with it, the writer waits ~0.5 s. A stall past this is the bug.
STALL_S = 5.0

CHILD = textwrap.dedent(
    """
    from gevent import monkey; monkey.patch_all()
    import json, sys, time
    import gevent
    from jobs_platform import db

    engine = db.engine_for(sys.argv[1])
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    outcome = {}

    def holder():
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            with engine.connect() as nested:  # a read of the same greenlet: no deadlock
                nested.exec_driver_sql("SELECT count(*) FROM t").scalar()
            gevent.sleep(0.5)  # yields inside the write transaction

    def writer():
        gevent.sleep(0.1)
        start = time.monotonic()
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        outcome["writer_waited_s"] = time.monotonic() - start

    def ticker():
        last, worst = time.monotonic(), 0.0
        for _ in range(30):
            gevent.sleep(0.05)
            now = time.monotonic()
            worst, last = max(worst, now - last), now
        outcome["worst_hub_gap_s"] = worst

    gevent.joinall([gevent.spawn(f) for f in (holder, writer, ticker)], raise_error=True)
    with engine.connect() as conn:
        outcome["rows"] = conn.exec_driver_sql("SELECT count(*) FROM t").scalar()
    print(json.dumps(outcome))
    """
)


def test_greenlets_of_one_gevent_process_take_sqlite_in_turn(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.sqlite3'}"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, url], capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["rows"] == 2
    assert outcome["writer_waited_s"] < STALL_S, outcome
    assert outcome["worst_hub_gap_s"] < STALL_S, outcome
