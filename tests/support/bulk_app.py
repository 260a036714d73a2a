"""Tasks for the bulk-dispatch tests (tests/integration/redis/test_bulk_dispatch.py).

Workers run ``-A tests.support.bulk_app`` with ``JOBS_BROKER_URL`` set to the test's own
Redis; a test process builds its own app for its broker with :func:`make_app` (this module
may have been imported before the test's environment was set). Each run records what the
worker received in ``bulk:runs:<key>``.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import redis

from jobs_platform import ReliableTask, create_app
from jobs_platform.history import ENQUEUED_HEADER

#: Short enough that a 60 s countdown goes to the delayed store, not to a worker.
VISIBILITY_TIMEOUT = 20.0
MARGIN = 2.0


def make_app(broker_url: str | None = None, **overrides: Any) -> Any:
    url = broker_url or os.environ.get("JOBS_BROKER_URL", "redis://127.0.0.1:6379/0")
    return create_app(
        "bulkapp",
        broker_url=url,
        visibility_timeout=VISIBILITY_TIMEOUT,
        visibility_margin=MARGIN,
        unacked_restore_interval=1.0,
        worker_lease=4.0,
        **overrides,
    )


def declare(app: Any) -> SimpleNamespace:
    @app.task(base=ReliableTask, bind=True, name="bulk.record", queue="fast", time_limit=5)
    def record(self: Any, key: str, n: int = 0) -> int:
        request = self.request
        delivery = request.delivery_info or {}
        entry = {
            "id": request.id,
            "n": n,
            "queue": delivery.get("routing_key"),
            "priority": delivery.get("priority"),
            "stamp": (request.headers or {}).get(ENQUEUED_HEADER)
            or getattr(request, ENQUEUED_HEADER, None),
            "root_id": request.root_id,
            "argsrepr": request.argsrepr,
        }
        url = self.app.conf.broker_url
        redis.Redis.from_url(url).rpush(f"bulk:runs:{key}", json.dumps(entry))
        return n

    @app.task(
        base=ReliableTask,
        name="bulk.charge",
        queue="thirdparty",
        business_key=("invoice_id",),
        unique_for=600,
        time_limit=5,
    )
    def charge(invoice_id: int, amount: int = 0) -> int:
        return invoice_id

    return SimpleNamespace(record=record, charge=charge)


app = make_app()
tasks = declare(app)
