"""A forked child never hangs on the per-process cache's lock (jobs_platform.process_local).

A prefork pool may fork while another thread of the parent (the delayed releaser, the
dead-letter drainer) is building a per-process object under the cache's lock. The child
inherits that lock held by a thread that does not exist in it: its ``worker_process_init``
(:func:`~jobs_platform.process_local.forget_inherited`) then waited for ever, and the
worker consumed one job that never ran.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
from pathlib import Path

from jobs_platform import process_local

#: The child's limit: forget_inherited() takes microseconds; a hang ends here.
CHILD_DEADLINE_S = 10
#: Forks beside a thread busy in SQLite (a few seconds in all).
FORKS = 150


def test_a_child_forked_while_another_thread_builds_an_object_forgets_without_waiting() -> None:
    building = threading.Event()
    finish = threading.Event()

    def slow_factory() -> object:
        building.set()  # the lock is held from here until finish is set
        finish.wait(30)
        return object()

    builder = threading.Thread(
        target=process_local.per_process, args=(("test-fork", id(finish)), slow_factory)
    )
    builder.start()
    try:
        assert building.wait(10), "the factory did not start"
        pid = os.fork()
        if pid == 0:  # the child: exits 0 only if forget_inherited() returns
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not pytest-timeout's handler
            signal.alarm(CHILD_DEADLINE_S)
            code = 1
            try:
                process_local.forget_inherited()
                code = 0
            finally:
                os._exit(code)
    finally:
        finish.set()
        builder.join(10)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"the child hung in forget_inherited() (status {status:#x}): it inherited the "
        "cache's lock held by a thread that does not exist in it"
    )


def test_no_child_forked_beside_a_thread_in_sqlite_hangs_in_sqlite(tmp_path: Path) -> None:
    """A pool process forked while the parent's outbox relay or drainer is inside SQLite
    inherited SQLite's own mutexes locked and hung at its first write (a dead letter), until
    its hard time limit. Those threads pass through ``fork_safe()``; a fork waits them out.
    Without the gate about one child in seven hung here."""
    path = str(tmp_path / "fork.sqlite3")
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
    stop = threading.Event()

    def poll() -> None:  # what the relay does every pass: open, read, close
        while not stop.is_set():
            with process_local.fork_safe():
                conn = sqlite3.connect(path)
                conn.execute("SELECT x FROM t LIMIT 1").fetchall()
                conn.close()

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    hung = 0
    try:
        for _ in range(FORKS):
            pid = os.fork()
            if pid == 0:  # the child: a write, as a dead letter's would be
                signal.signal(signal.SIGALRM, signal.SIG_DFL)
                signal.alarm(CHILD_DEADLINE_S)
                conn = sqlite3.connect(path)
                conn.execute("INSERT INTO t VALUES (1)")
                conn.commit()
                conn.close()
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            hung += not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
    finally:
        stop.set()
        poller.join(10)
    assert hung == 0, f"{hung} of {FORKS} children hung in SQLite"
