"""tests/integration/sql/: the real PostgreSQL and SQLite, and no Redis or RabbitMQ (guarded)."""

from __future__ import annotations

import pytest

from tests.support import guards

folder_guard, service_guard = guards.fixtures(guards.SQL_ONLY)


@pytest.fixture(scope="session")
def redis_url() -> str:
    # Session-scoped: it would be set up before the folder's guard could see it.
    guards.refused_fixture("redis_url", guards.SQL_ONLY)
