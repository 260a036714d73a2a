"""Unit tests need no service, no root and no network: the guard makes that a checked rule."""

from __future__ import annotations

import pytest

from tests.support import guards

folder_guard, service_guard = guards.fixtures(guards.UNIT)


# The service fixtures of tests/conftest.py, refused by name: being session-scoped, they would
# be set up before the guard above is in place.
@pytest.fixture(scope="session")
def redis_url() -> str:
    guards.refused_fixture("redis_url", guards.UNIT)


@pytest.fixture(scope="session")
def pg_url() -> str:
    guards.refused_fixture("pg_url", guards.UNIT)


@pytest.fixture(scope="module")
def module_pg_url() -> str:
    guards.refused_fixture("module_pg_url", guards.UNIT)
