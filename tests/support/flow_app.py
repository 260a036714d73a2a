"""Tasks under flow control, for tests/acceptance/test_flow_control.py.

Each run records its start and end on the Redis clock (``TIME``), so overlaps and delays
are measured on one clock whatever the machine's load does to the workers.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jobs_platform import ReliableTask, create_app
from tests.support.recording import client

app = create_app("flowapp", retry_backoff=0.2, retry_backoff_max=1.0)


def redis_now() -> float:
    seconds, micros = client().time()
    return float(seconds) + micros / 1e6


def _event(tag: str, **fields: Any) -> None:
    client().rpush(f"jptest:flow:{tag}", json.dumps({**fields, "t": redis_now()}))


@app.task(
    base=ReliableTask,
    bind=True,
    name="flow.per_account",
    queue="fast",
    concurrency_key=lambda tag, account, n, hold_s=0.5: f"{tag}:{account}",
)
def per_account(self: Any, tag: str, account: str, n: int, hold_s: float = 0.5) -> None:
    """Runs ``hold_s`` seconds, or until ``jptest:flow:release:<tag>`` is set."""
    meta = {
        "account": account,
        "n": n,
        "task_id": self.request.id,
        "host": self.request.hostname,
        "retries": self.request.retries,
    }
    _event(tag, kind="start", **meta)
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline and not client().exists(f"jptest:flow:release:{tag}"):
        time.sleep(0.05)
    _event(tag, kind="end", **meta)


@app.task(
    base=ReliableTask,
    bind=True,
    name="flow.reindex",
    queue="fast",
    debounce=2.0,
    debounce_key=lambda tag, document, version: f"{tag}:{document}",
)
def reindex(self: Any, tag: str, document: int, version: int) -> None:
    _event(tag, kind="run", document=document, version=version, task_id=self.request.id)


def events(tag: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in client().lrange(f"jptest:flow:{tag}", 0, -1)]


@app.task(
    base=ReliableTask,
    bind=True,
    name="flow.partner",
    queue="fast",
    rate_limit="5/s",
    rate_key="partner-x",
)
def partner(self: Any, tag: str) -> None:
    _event(tag, kind="run", task_id=self.request.id)


@app.task(
    base=ReliableTask,
    bind=True,
    name="flow.tenant_job",
    queue="heavy",
    fairness_key=lambda tag, tenant, n, hold_s=0.01: tenant,
)
def tenant_job(self: Any, tag: str, tenant: str, n: int, hold_s: float = 0.01) -> None:
    """Records its start in order (one list: the order starts happened in); runs ``hold_s``
    seconds, or until ``jptest:fair:release:<tag>`` is set."""
    client().rpush(f"jptest:fair:{tag}", f"{tenant}:{n}")
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        if hold_s > 1 and client().exists(f"jptest:fair:release:{tag}"):
            break
        time.sleep(min(hold_s, 0.05))


#: While this key exists the downstream of ``flow.downstream`` is down (refuses calls).
DOWN_FLAG = "jptest:breaker:down"


@app.task(
    base=ReliableTask,
    bind=True,
    name="flow.downstream",
    queue="fast",
    rate_key="flaky-partner",
    breaker_threshold=3,
    breaker_window=60,
    breaker_cooldown=2,
    max_retries=20,
)
def downstream(self: Any, tag: str, n: int) -> None:
    """Calls the partner: refused while :data:`DOWN_FLAG` is set (a transient error, as a
    refused connection is), else records a success that held the call ``0.2`` s."""
    meta = {"n": n, "task_id": self.request.id, "retries": self.request.retries}
    if client().exists(DOWN_FLAG):
        _event(tag, kind="fail", **meta)
        raise ConnectionRefusedError("partner down")
    _event(tag, kind="start", **meta)
    time.sleep(0.2)
    _event(tag, kind="end", **meta)
