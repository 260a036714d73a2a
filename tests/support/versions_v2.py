"""Version 2 of ``versions.ship``: the address split into street and city, with the upcaster
from version 1 (tests/acceptance/test_versions.py)."""

from __future__ import annotations

import os
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.versions_common import NAME, record

app = create_app(
    "versionsv2",
    broker_url=os.environ["JOBS_BROKER_URL"],
    dlq_drain_interval=0.5,
    retry_backoff=0.2,
    retry_backoff_max=0.4,
)


def split_address(args: Any, kwargs: Any) -> tuple[Any, Any]:
    """Version 1's ``(key, "street, city")`` as version 2's ``(key, street, city)``."""
    key, address = args
    street, _, city = address.rpartition(", ")
    return (key, street, city), kwargs


@app.task(
    base=ReliableTask,
    bind=True,
    name=NAME,
    queue="fast",
    version=2,
    upcast={1: split_address},
    shared=False,  # the test process imports every version; each app keeps its own
)
def ship(self: Any, key: str, street: str, city: str) -> None:
    record(self, key, 2, street=street, city=city)
