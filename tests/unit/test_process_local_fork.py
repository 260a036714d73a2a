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
import threading

from jobs_platform import process_local

#: The child's limit: forget_inherited() takes microseconds; a hang ends here.
CHILD_DEADLINE_S = 10


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
