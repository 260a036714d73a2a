"""Session fixtures: an isolated Redis database on the shared server, cleaned up after."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest
import redis

SHARED_REDIS = os.environ.get("JOBS_TEST_REDIS", "redis://127.0.0.1:6379")
CLAIM_KEY = "jobs-platform:test-session"


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A Redis database number no one else uses (claimed with a key), flushed at the end."""
    token = uuid.uuid4().hex
    for db in range(15, 0, -1):
        client = redis.Redis.from_url(f"{SHARED_REDIS}/{db}")
        try:
            client.ping()
        except redis.ConnectionError as exc:
            pytest.fail(f"the shared Redis at {SHARED_REDIS} does not answer: {exc}")
        if client.dbsize() == 0 and client.set(CLAIM_KEY, token, nx=True, ex=3600):
            try:
                yield f"{SHARED_REDIS}/{db}"
            finally:
                client.flushdb()
                client.close()
            return
        client.close()
    pytest.fail("no empty Redis database (1-15) to isolate the test session in")


@pytest.fixture()
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


PG_ADMIN_URL = os.environ.get(
    "JOBS_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


@contextlib.contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A PostgreSQL database created for the caller and dropped (even if in use) at the end."""
    import sqlalchemy as sa

    name = f"jobs_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_ADMIN_URL} does not answer: {exc}")
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A PostgreSQL database of this test session's own."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture()
def sqlite_url(tmp_path: object) -> str:
    return f"sqlite:///{tmp_path}/jobs.sqlite3"


@pytest.fixture(scope="module")
def module_pg_url() -> Iterator[str]:
    """A PostgreSQL database of this test module's own (dead-letter tests wipe their table)."""
    with fresh_pg_database() as url:
        yield url
