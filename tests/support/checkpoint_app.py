"""A long job that checkpoints, for kill/retry/replay tests (short visibility timeout).

``ckpt.rows(key, total, interval)`` processes rows ``0..total-1`` from where
``last_checkpoint()`` says, pushing each row number to ``jptest:rows:<key>`` (so a test
counts rows done twice), and checkpoints ``{"row": next}`` every ``interval`` rows. Each row
takes ``pause`` seconds. At row ``die_at``, while ``jptest:trap:<key>`` holds a mode, it
fails: ``kill_child`` SIGKILLs its pool process (once: the trap is taken first),
``permanent`` raises PermanentError (a dead letter), ``transient`` raises TransientError.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from jobs_platform.errors import PermanentError, TransientError
from tests.support.recording import client, record

app = create_app(
    "ckpt",
    visibility_timeout=8.0,
    visibility_margin=2.0,
    unacked_restore_interval=1.0,
    worker_lease=3.0,
    retry_backoff=0.2,
    retry_backoff_max=0.5,
    max_delay=60.0,
    checkpoint_max_bytes=256,
)


@app.task(base=ReliableTask, bind=True, name="ckpt.rows", queue="fast", max_retries=3)
def rows(
    self: Any, key: str, total: int, interval: int, pause: float = 0.0, die_at: int = -1
) -> int:
    record(self, key)
    redis = client()
    start = (self.last_checkpoint() or {"row": 0})["row"]
    redis.rpush(f"jptest:starts:{key}", start)
    for row in range(start, total):
        if row == die_at:
            trap = redis.get(f"jptest:trap:{key}")
            if trap == b"kill_child":
                redis.delete(f"jptest:trap:{key}")
                os.kill(os.getpid(), signal.SIGKILL)
            elif trap == b"permanent":
                raise PermanentError(f"row {row} is poison")
            elif trap == b"transient":
                redis.delete(f"jptest:trap:{key}")
                raise TransientError(f"row {row}: try again")
        redis.rpush(f"jptest:rows:{key}", row)
        if pause:
            time.sleep(pause)
        if (row + 1) % interval == 0:
            self.checkpoint({"row": row + 1})
    return total


@app.task(base=ReliableTask, bind=True, name="ckpt.too_big", queue="fast", max_retries=3)
def too_big(self: Any, size: int) -> None:
    self.checkpoint({"blob": "x" * size})
