"""Engines and the schema of the platform's own tables (dead letters, idempotency keys).

Engines are created lazily *per process* and keyed by PID: Celery's prefork children
inherit the parent's memory, and a connection pool shared across a fork corrupts
connections. SQLite is the embedded default (WAL, busy timeout); PostgreSQL in production.
Migrations are Alembic's, applied with :func:`upgrade` (``celery -A APP db upgrade``).
"""

from __future__ import annotations

import os
import threading
from importlib import resources
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


_lock = threading.Lock()
_engines: dict[tuple[int, str], sa.Engine] = {}


def engine_for(url: str) -> sa.Engine:
    """The engine for ``url`` in this process (created on first use)."""
    key = (os.getpid(), url)
    engine = _engines.get(key)
    if engine is not None:
        return engine
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _create(url)
            _engines[key] = engine
        return engine


def _create(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30})

        @sa.event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    connect_args = {"connect_timeout": 5} if url.startswith("postgresql") else {}
    # A black-holed database must fail a write in seconds (the dead-letter spool takes
    # over), not after the kernel's TCP timeout.
    return sa.create_engine(
        url, pool_pre_ping=True, pool_size=5, max_overflow=5, connect_args=connect_args
    )


def dispose_engines() -> None:
    """Drop every engine inherited from a parent process (call in worker_process_init)."""
    with _lock:
        for (pid, _url), engine in list(_engines.items()):
            if pid != os.getpid():
                engine.dispose(close=False)  # do not close the parent's sockets
                del _engines[(pid, _url)]


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("jobs_platform") / "migrations"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


#: Serialises migrations of workers starting at once against one PostgreSQL database.
_MIGRATION_LOCK_ID = 0x6A6F6273  # "jobs"


def upgrade(url: str, revision: str = "head") -> None:
    """Apply the platform's migrations to ``url`` (idempotent; safe to call at every start)."""
    from alembic import command

    if not url.startswith("postgresql"):
        command.upgrade(alembic_config(url), revision)  # SQLite serialises writers itself
        return
    with engine_for(url).connect() as lock_conn:
        lock_conn.execute(sa.text("SELECT pg_advisory_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
        try:
            command.upgrade(alembic_config(url), revision)
        finally:
            lock_conn.execute(sa.text("SELECT pg_advisory_unlock(:id)"), {"id": _MIGRATION_LOCK_ID})
