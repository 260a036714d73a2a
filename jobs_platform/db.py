"""Engines and the schema of the platform's own tables (dead letters, idempotency keys).

Engines are created lazily *per process* (:mod:`jobs_platform.process_local`): Celery's
prefork children inherit the parent's memory, and a connection pool shared across a fork
corrupts connections, so a child releases the engines it inherited in
``worker_process_init``. SQLite is the embedded default (WAL, busy timeout); PostgreSQL in
production.

Migrations are Alembic's, applied with :func:`upgrade` (``celery -A APP db upgrade``), or
at worker start with :func:`try_upgrade` (bounded retries, never raises). Their revisions
live in a version table of their own (:data:`VERSION_TABLE`): an app that runs its own
Alembic on the same database keeps ``alembic_version`` to itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
from collections.abc import Iterator
from importlib import resources
from typing import Any

import sqlalchemy as sa
import tenacity
from sqlalchemy.orm import DeclarativeBase

from jobs_platform.errors import ConfigError
from jobs_platform.process_local import per_process
from jobs_platform.urls import masked

logger = logging.getLogger("jobs_platform.db")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


def insert_ignoring(
    conn: sa.Connection, table: sa.Table, values: dict[str, Any], *, unique: list[str]
) -> Any:
    """``INSERT ... ON CONFLICT (unique) DO NOTHING`` for the dialects the platform supports.

    The platform's exactly-once writes (one dead letter per job, one claim per key) rest on
    a UNIQUE constraint doing the arbitration, never on a read-then-write.
    """
    from sqlalchemy.dialects import postgresql, sqlite

    dialect = conn.dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).values(values).on_conflict_do_nothing(index_elements=unique)
    if dialect == "sqlite":
        return sqlite.insert(table).values(values).on_conflict_do_nothing(index_elements=unique)
    raise ConfigError(f"the platform's tables need PostgreSQL or SQLite, not {dialect}")


def engine_for(url: str) -> sa.Engine:
    """The engine for ``url`` in this process (created on first use)."""
    return per_process(("engine", url), lambda: _create(url), release=_release)


def statement_engine_for(url: str) -> sa.Engine:
    """This process's engine for one-statement transactions on a hot path (a batch member's
    outcome, :func:`jobs_platform.batches.counting.record_alone`): PostgreSQL in autocommit
    (no BEGIN/COMMIT round trips) and no ping at checkout (a ping is a round trip per
    statement). A pooled connection found dead fails its statement with
    ``connection_invalidated`` (the pool drops it): the caller runs the statement once more.
    Two connections kept per process at most; SQLite uses :func:`engine_for`."""
    return per_process(("statements", url), lambda: _create_statements(url), release=_release)


def _create_statements(url: str) -> sa.Engine:
    return sa.create_engine(
        url,
        isolation_level="AUTOCOMMIT",
        pool_size=2,
        max_overflow=8,
        connect_args={"connect_timeout": 5},
    )


def _release(engine: sa.Engine) -> None:
    engine.dispose(close=False)  # a forked child must not close the parent's connections


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

        if _cooperative():
            _one_connection_at_a_time(engine)
        return engine
    connect_args = {"connect_timeout": 5} if url.startswith("postgresql") else {}
    # A black-holed database must fail a write in seconds (the dead-letter spool takes
    # over), not after the kernel's TCP timeout.
    return sa.create_engine(
        url, pool_pre_ping=True, pool_size=5, max_overflow=5, connect_args=connect_args
    )


def _cooperative() -> bool:
    """Whether this process runs greenlets on one OS thread (a gevent-patched worker)."""
    gevent = sys.modules.get("gevent.monkey")
    return bool(gevent and gevent.is_module_patched("threading"))


def _one_connection_at_a_time(engine: sa.Engine) -> None:
    """Hand out the engine's SQLite connections to one greenlet at a time, waiting cooperatively.

    SQLite's busy wait sleeps in C. In a gevent process every greenlet shares one OS thread,
    so a greenlet waiting for the write lock that another greenlet of the *same* process
    holds (suspended inside its transaction, say while it publishes to Redis) froze the whole
    process for the busy timeout: consumer loop, heartbeats and leases included (30 s, seen
    in the demo's thirdparty worker). A wait for another process's lock still blocks, but
    only for that transaction's length."""
    from gevent import getcurrent  # type: ignore[import-untyped]
    from gevent.lock import Semaphore  # type: ignore[import-untyped]

    gate = Semaphore(1)
    held: dict[str, Any] = {"owner": None, "depth": 0}

    @sa.event.listens_for(engine, "checkout")
    def _enter(*_args: Any) -> None:
        me = getcurrent()
        if held["owner"] is me:  # a nested connection of the same greenlet (reads do not lock)
            held["depth"] += 1
            return
        gate.acquire()
        held["owner"], held["depth"] = me, 1

    @sa.event.listens_for(engine, "checkin")
    def _leave(*_args: Any) -> None:
        if held["depth"] == 0:
            return
        held["depth"] -= 1
        if held["depth"] == 0:
            held["owner"] = None
            gate.release()


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(resources.files("jobs_platform") / "migrations"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


#: The platform's Alembic version table; Alembic's default one belongs to the app.
VERSION_TABLE = "jobs_platform_alembic_version"
LEGACY_VERSION_TABLE = "alembic_version"

#: The revisions older releases wrote to ``alembic_version``, each with the tables it had
#: created. A row there is the platform's only if those tables exist: an app may number its
#: own revisions 0001, 0002... too. Later revisions are only ever written to VERSION_TABLE.
LEGACY_REVISIONS: dict[str, tuple[str, ...]] = {
    "0001": ("dead_letter_jobs",),
    "0002": ("dead_letter_jobs", "idempotency_keys"),
}
_LEGACY_TABLES = sorted({name for names in LEGACY_REVISIONS.values() for name in names})

#: Attempts of :func:`try_upgrade`.
START_MIGRATE_ATTEMPTS = 3
#: Serialises migrations of workers starting at once against one PostgreSQL database.
_MIGRATION_LOCK_ID = 0x6A6F6273  # "jobs"


@dataclasses.dataclass(frozen=True)
class LegacyMove:
    """The platform's revision moved out of ``alembic_version`` by :func:`upgrade`."""

    revision: str
    dropped: bool  # alembic_version held only the platform's row and is gone
    left: tuple[str, ...]  # the app's revisions still in alembic_version

    def __str__(self) -> str:
        moved = (
            f"moved platform revision {self.revision} from {LEGACY_VERSION_TABLE} "
            f"to {VERSION_TABLE}"
        )
        if self.dropped:
            return f"{moved}; dropped {LEGACY_VERSION_TABLE} (it held only that revision)"
        kept = ", ".join(self.left) or "no rows"
        return f"{moved}; {LEGACY_VERSION_TABLE} keeps the app's revisions ({kept})"


def upgrade(url: str, revision: str = "head") -> LegacyMove | None:
    """Apply the platform's migrations to ``url`` (idempotent; safe to call at every start).

    A database migrated by an older release has the platform's revision in
    ``alembic_version``: it is moved to :data:`VERSION_TABLE` first (what was moved is
    returned). Raises :class:`ConfigError` when the recorded state is ambiguous.
    """
    from alembic import command

    with _migration_lock(url):
        moved = _move_legacy_revision(url)
        check_not_half_migrated(url, revision)
        command.upgrade(alembic_config(url), revision)
    return moved


#: The tables each of the platform's revisions creates (a revision not listed creates none).
#: The tables each revision creates (a test checks every revision is listed).
CREATES: dict[str, tuple[str, ...]] = {
    "0001": ("dead_letter_jobs",),
    "0002": ("idempotency_keys",),
    "0003": ("dead_letter_counts",),
    "0005": ("job_outbox",),
    "0006": (),
    "0007": ("job_batches", "job_batch_members"),
    "0008": (),
}


def check_not_half_migrated(url: str, revision: str = "head") -> None:
    """Refuse, in one paragraph, an upgrade that would fail on a table already there.

    A database whose version table is behind its tables (a run that created a table but
    was never recorded, ``create_all``, a hand-made ``db stamp``) would end in the driver's
    DuplicateTable error; this says what was found and which ``db stamp`` records it.
    """
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    script = ScriptDirectory.from_config(alembic_config(url))
    with engine_for(url).connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        opts = {"version_table": VERSION_TABLE}
        recorded = MigrationContext.configure(conn, opts=opts).get_current_heads()
    try:
        lower = recorded[0] if len(recorded) == 1 else "base"
        pending = [s.revision for s in script.iterate_revisions(revision, lower)]
    except CommandError:
        return  # not a plain upgrade (a downgrade target, branches): Alembic's own words
    there = sorted({t for rev in pending for t in CREATES.get(rev, ()) if t in tables})
    if not there:
        return
    at = None
    for rev in reversed([s.revision for s in script.walk_revisions()]):  # base first
        if not all(t in tables for t in CREATES.get(rev, ())):
            break
        at = rev
    found = ", ".join(recorded) or "no revision"
    raise ConfigError(
        f"the platform's database at {masked(url)} is half-migrated: {VERSION_TABLE} records "
        f"{found}, but {', '.join(there)} (created by a later revision) already exist"
        f"{'s' if len(there) == 1 else ''}, so the upgrade would fail on CREATE TABLE. If "
        f"{'it is' if len(there) == 1 else 'they are'} the platform's (a run that was never "
        "recorded, or create_all), record the revision the tables are at with "
        f"`celery -A APP db stamp {at}` and run `db upgrade` again; nothing was changed"
    )


def try_upgrade(url: str) -> bool:
    """:func:`upgrade` with bounded retries, for a worker's start; whether the schema is current.

    A database that is down at start must not stop the worker (dead letters wait in the
    spool meanwhile): the failure is logged (``jobs.db.migrate_failed``), not raised, and
    the caller tries again later.
    """
    # Two workers starting at once can race on the first CREATE TABLE; the loser's retry
    # finds the schema in place.
    try:
        tenacity.Retrying(
            stop=tenacity.stop_after_attempt(START_MIGRATE_ATTEMPTS),
            wait=tenacity.wait_exponential(multiplier=0.2, max=2.0),
            reraise=True,
        )(upgrade, url)
    except Exception as exc:
        logger.error(
            "jobs.db.migrate_failed: could not migrate %s: %s",
            masked(url),
            exc,
            extra={"event": "jobs.db.migrate_failed"},
        )
        return False
    return True


def stamp(url: str, revision: str) -> None:
    """Record ``revision`` in :data:`VERSION_TABLE` without running migrations."""
    from alembic import command

    with _migration_lock(url):
        command.stamp(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The platform's revision recorded in :data:`VERSION_TABLE` (``None``: none yet)."""
    from alembic.migration import MigrationContext

    with engine_for(url).connect() as conn:
        opts = {"version_table": VERSION_TABLE}
        heads = MigrationContext.configure(conn, opts=opts).get_current_heads()
    return ", ".join(heads) or None


def legacy_revision(url: str) -> str | None:
    """The platform's revision an older release left in ``alembic_version``, not yet moved."""
    with engine_for(url).connect() as conn:
        return _legacy_revision(conn)


@contextlib.contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    if url.startswith("sqlite"):
        with _sqlite_migration_lock(url):
            yield
        return
    if not url.startswith("postgresql"):
        yield
        return
    with engine_for(url).connect() as lock_conn:
        lock_conn.execute(sa.text("SELECT pg_advisory_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
        try:
            yield
        finally:
            lock_conn.execute(sa.text("SELECT pg_advisory_unlock(:id)"), {"id": _MIGRATION_LOCK_ID})


@contextlib.contextmanager
def _sqlite_migration_lock(url: str) -> Iterator[None]:
    """An exclusive lock on a file beside the database (SQLite lives on one host): two
    workers starting at once must not both apply a revision Alembic read as pending. The
    database's own write lock cannot serve, as a migration runs several transactions."""
    import fcntl

    database = sa.engine.make_url(url).database
    if not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _move_legacy_revision(url: str) -> LegacyMove | None:
    """Move the platform's row from ``alembic_version`` to VERSION_TABLE, in one transaction."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    with engine_for(url).connect() as conn:
        if sa.inspect(conn).has_table(VERSION_TABLE):
            return None  # the usual start: nothing to move, and no write lock taken for it
        conn.rollback()
        if conn.dialect.name == "sqlite":
            # pysqlite runs DDL outside any transaction unless one is open; IMMEDIATE also
            # takes the write lock now, so two workers starting at once move the row once.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        revision = _legacy_revision(conn)
        if revision is None:
            conn.rollback()
            return None
        ours = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        ours.stamp(ScriptDirectory.from_config(alembic_config(url)), revision)
        theirs = MigrationContext.configure(conn)
        before = theirs.get_current_heads()
        legacy = sa.table(LEGACY_VERSION_TABLE, sa.column("version_num"))
        conn.execute(sa.delete(legacy).where(legacy.c.version_num == revision))
        left = theirs.get_current_heads()
        dropped = before == (revision,) and not left
        if dropped:
            sa.Table(LEGACY_VERSION_TABLE, sa.MetaData()).drop(conn)
        conn.commit()
    move = LegacyMove(revision, dropped, left)
    logger.info("jobs.db.version_moved: %s", move, extra={"event": "jobs.db.version_moved"})
    return move


def _legacy_revision(conn: sa.Connection) -> str | None:
    """The platform's revision in ``alembic_version`` when VERSION_TABLE does not exist yet."""
    from alembic.migration import MigrationContext

    inspector = sa.inspect(conn)
    if inspector.has_table(VERSION_TABLE):
        return None  # moved already, or created by this release: alembic_version is the app's
    tables = set(inspector.get_table_names())
    rows = MigrationContext.configure(conn).get_current_heads()  # () without the table
    ours = []
    for row in rows:
        created = set(LEGACY_REVISIONS.get(row, ()))
        if created and created <= tables:
            ours.append(row)
        elif created & tables:
            raise ConfigError(
                f"{LEGACY_VERSION_TABLE} holds revision {row}, but only some of the tables "
                f"the platform's {row} creates exist ({', '.join(sorted(created & tables))}): "
                "record the platform's real revision with `celery -A APP db stamp REVISION`"
            )
    if len(ours) > 1:
        raise ConfigError(
            f"{LEGACY_VERSION_TABLE} holds several revisions that could be the platform's "
            f"({', '.join(ours)}): record the platform's with `celery -A APP db stamp "
            f"REVISION` and delete it from {LEGACY_VERSION_TABLE} by hand"
        )
    if ours:
        return ours[0]
    present = [name for name in _LEGACY_TABLES if name in tables]
    if present:
        raise ConfigError(
            f"the platform's tables exist ({', '.join(present)}) but no platform revision is "
            f"recorded in {VERSION_TABLE} or {LEGACY_VERSION_TABLE}: record the revision they "
            "are at with `celery -A APP db stamp REVISION` (0002 if both exist)"
        )
    return None
