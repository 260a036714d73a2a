"""A producer (a web process that declares tasks and calls ``.delay()``) never loads
SQLAlchemy or Alembic: they cost ~30 MB per process and only workers and the guards use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.integration

PRODUCER = textwrap.dedent(
    """
    import json, sys

    import jobs_platform
    from jobs_platform import ReliableTask, create_app

    app = create_app("producer")

    @app.task(base=ReliableTask, queue="fast", business_key=("order_id",), unique_for=30)
    def ship(order_id: int) -> None: ...

    ship.delay(7)
    before = sorted(m for m in sys.modules if m.split(".")[0] in ("sqlalchemy", "alembic"))
    from jobs_platform import transition  # the guards still import on first use
    print(json.dumps({"loaded": before, "guard": transition.__module__}))
    """
)


def test_declaring_and_dispatching_loads_no_sqlalchemy(redis_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PRODUCER],
        env={**os.environ, "JOBS_BROKER_URL": redis_url},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["loaded"] == []
    assert out["guard"] == "jobs_platform.idempotency.cas"
