"""An app whose declaration breaks one invariant, chosen by ``JOBS_TEST_REFUSAL``.

The worker must refuse to start with a clear message instead of running unsafely.
"""

from __future__ import annotations

import os

from jobs_platform import ReliableTask, create_app

CASE = os.environ.get("JOBS_TEST_REFUSAL", "none")
app = create_app(
    "refusal",
    visibility_timeout=30.0,
    visibility_margin=5.0,
    max_delay=20.0,
    retry_backoff_max=5.0,
    # On Redis a running job is held by its worker's lease, not the visibility timeout (so a
    # long time_limit is no longer refused there); the lease itself must end well before it.
    worker_lease=28.0 if CASE == "lease" else 15.0,
)

options: dict[str, object] = {"queue": "fast", "time_limit": 10.0, "retry_backoff_max": 5.0}
if CASE == "retry_wait":
    options["retry_backoff_max"] = 25.0  # longer than JOBS_MAX_DELAY (20 s here)
elif CASE == "soft_limit":
    options["soft_time_limit"] = 12.0  # not below the hard limit of 10


@app.task(base=ReliableTask, name="refusal.noop", **options)
def noop() -> None:
    return None
