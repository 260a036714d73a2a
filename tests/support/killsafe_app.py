"""A task for the kill-safe fetch acceptance tests, on a short visibility timeout (10 s).

Configured from the environment (``JOBS_BROKER_URL``: the test's private redis-server).
``JPTEST_UNSAFE_FETCH=1`` gives the worker the platform's transport without the kill-safe
fetch (kombu's ``BRPOP``), to show the loss it prevents; ``JPTEST_BRPOP_TIMEOUT`` sets how
long an idle consumer blocks on the broker (kombu's ``polling_interval``; 1 s by default).
"""

from __future__ import annotations

import os
import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from jobs_platform.brokers.redis import transport
from tests.support.recording import client

app = create_app(
    "killsafe",
    visibility_timeout=10.0,
    visibility_margin=2.0,
    unacked_restore_interval=1.0,
    worker_lease=3.0,
    retry_backoff=0.2,
    retry_backoff_max=0.5,  # wait + hard limit (5 s) must stay below 10 - 2
)


class UnsafeChannel(transport.Channel):
    """The platform's channel with kombu's fetch."""

    kill_safe_fetch = False


class UnsafeTransport(transport.Transport):
    Channel = UnsafeChannel


# kombu's restore sweep holds a Redis lock (unacked_mutex) that expires after 300 s by
# default: a worker SIGKILLed during a sweep stops every restore for that long. Not what
# these tests are about, so the lock is short here.
app.conf.broker_transport_options = {
    **app.conf.broker_transport_options,
    "unacked_mutex_expire": 5,
}
if os.environ.get("JPTEST_UNSAFE_FETCH") == "1":
    app.conf.broker_transport = f"{__name__}:UnsafeTransport"
if os.environ.get("JPTEST_BRPOP_TIMEOUT"):
    app.conf.broker_transport_options = {
        **app.conf.broker_transport_options,
        "polling_interval": float(os.environ["JPTEST_BRPOP_TIMEOUT"]),
    }


@app.task(base=ReliableTask, bind=True, name="killsafe.note", queue="fast", time_limit=5.0)
def note(self: Any, key: str, n: int, seconds: float = 0.0) -> None:
    """Record that job ``n`` of ``key`` ran (every run counted), after ``seconds``."""
    time.sleep(seconds)
    pipe = client().pipeline()
    pipe.sadd(f"jptest:ran:{key}", n).incr(f"jptest:runs:{key}")
    pipe.execute()
