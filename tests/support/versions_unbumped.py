"""``versions.ship`` with version 2's signature but still declared version 1: a deploy that
changed the signature without a version bump (tests/acceptance/test_versions.py)."""

from __future__ import annotations

import os
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.versions_common import NAME, record

app = create_app(
    "versionsunbumped",
    broker_url=os.environ["JOBS_BROKER_URL"],
    dlq_drain_interval=0.5,
    retry_backoff=0.2,
    retry_backoff_max=0.4,
)


# shared=False: the test process imports every version; each app keeps its own.
@app.task(base=ReliableTask, bind=True, name=NAME, queue="fast", shared=False)
def ship(self: Any, key: str, street: str, city: str) -> None:
    record(self, key, 1, street=street, city=city)
