"""What the payload-version apps share: how a run is recorded (tests/acceptance/test_versions.py).

``jptest:ran:<key>`` gets one JSON record per run of the body: the code's version, the
arguments the body received, the attempt and the task id. The Redis is the broker's.
"""

from __future__ import annotations

import json
from typing import Any

from tests.support.recording import client

NAME = "versions.ship"


def record(task: Any, key: str, version: int, **arguments: Any) -> None:
    entry = {
        "version": version,
        "arguments": arguments,
        "retries": task.request.retries,
        "task_id": task.request.id,
        "host": task.request.hostname,
    }
    client().rpush(f"jptest:ran:{key}", json.dumps(entry))


def ran(key: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in client().lrange(f"jptest:ran:{key}", 0, -1)]
