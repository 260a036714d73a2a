"""The platform's migrations next to an app's own Alembic, on real PostgreSQL and SQLite.

The platform (``celery -A tasks db ...``) and the app (the ``alembic`` CLI over a script
directory of its own) run as real subprocesses on one database, as they do in production.
The version table's name is spelled out here, not imported: these tests must also run (and
fail) against releases that wrote the platform's revision to ``alembic_version``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from jobs_platform import db
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.idempotency import IdempotencyKeys
from jobs_platform.testing import wait_for
from tests.conftest import fresh_pg_database

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
OURS = "jobs_platform_alembic_version"
DEFAULT = "alembic_version"
#: The newest revision the platform ships (what an upgrade ends at).
#: The last revision older releases recorded in alembic_version (the legacy layout).
LEGACY = "0002"
HEAD = ScriptDirectory.from_config(db.alembic_config("sqlite://")).get_current_head()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new, empty database for each test."""
    if request.param == "sqlite":
        database = f"sqlite:///{tmp_path}/shared.sqlite3"
        yield database
        db.engine_for(database).dispose()
        return
    with fresh_pg_database() as database:
        yield database
        db.engine_for(database).dispose()  # before the database is dropped


def platform(url: str, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """``celery -A tasks db ARGS`` in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tasks", "db", *args],
        env={**os.environ, "JOBS_DATABASE_URL": url},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


class AppAlembic:
    """The app's own Alembic: its script directory, one revision creating ``orders``, and
    the default version table (``alembic_version``)."""

    ENV = """
        from alembic import context
        from sqlalchemy import engine_from_config, pool

        config = context.config
        section = config.get_section(config.config_ini_section)
        engine = engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
        with engine.connect() as connection:
            context.configure(connection=connection, target_metadata=None)
            with context.begin_transaction():
                context.run_migrations()
        """
    REVISION = """
        import sqlalchemy as sa
        from alembic import op

        revision = {revision!r}
        down_revision = None
        branch_labels = None
        depends_on = None


        def upgrade():
            op.create_table(
                "orders",
                sa.Column("id", sa.Integer, primary_key=True),
                sa.Column("item", sa.String(50), nullable=False),
            )


        def downgrade():
            op.drop_table("orders")
        """

    def __init__(self, home: Path, url: str, revision: str) -> None:
        self.revision = revision
        self.ini = home / "alembic.ini"
        versions = home / "migrations" / "versions"
        versions.mkdir(parents=True)
        (home / "migrations" / "env.py").write_text(textwrap.dedent(self.ENV))
        (versions / f"{revision}_orders.py").write_text(
            textwrap.dedent(self.REVISION.format(revision=revision))
        )
        self.ini.write_text(
            "[alembic]\n"
            f"script_location = {home / 'migrations'}\n"
            f"sqlalchemy.url = {url.replace('%', '%%')}\n"
        )

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "alembic", "-c", str(self.ini), *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if ok:
            assert done.returncode == 0, done.stdout + done.stderr
        return done


@pytest.fixture()
def app_alembic(tmp_path: Path, url: str) -> AppAlembic:
    return AppAlembic(tmp_path / "app", url, revision="a1b2c3d4e5f6")


def rows(url: str, table: str) -> set[str] | None:
    """The revisions in ``table`` (``None``: no such table)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(table):
                return None
            return set(conn.execute(sa.text(f"SELECT version_num FROM {table}")).scalars())
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def make_legacy(url: str, *app_revisions: str) -> None:
    """The layout older releases left: the platform's tables, its revision in alembic_version
    (plus ``app_revisions`` there, as when an app shares that table)."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    db.upgrade(url, LEGACY)
    script = ScriptDirectory.from_config(db.alembic_config(url))
    with db.engine_for(url).begin() as conn:
        conn.execute(sa.text(f"DROP TABLE IF EXISTS {OURS}"))
        MigrationContext.configure(conn).stamp(script, LEGACY)  # what the old env.py wrote
        for revision in app_revisions:
            conn.execute(sa.text(f"INSERT INTO {DEFAULT} (version_num) VALUES ('{revision}')"))
    assert rows(url, DEFAULT) == {LEGACY, *app_revisions} and rows(url, OURS) is None


def seed(url: str) -> tuple[int, str]:
    """One dead letter and one finished idempotency key: what the move must not lose."""
    row_id = DeadLetterStore(url).add(
        DeadLetter(
            reason="permanent",
            task_id=str(uuid.uuid4()),
            task_name="billing.charge",
            queue="fast",
            errors=[{"type": "builtins.ValueError", "message": "no", "at": "t", "attempt": 1}],
            failed_at=dt.datetime.now(dt.UTC),
            args=[42],
            kwargs={"currency": "EUR"},
            attempts=1,
            chain="c",
            redacted=False,
        )
    )
    assert row_id is not None
    keys = IdempotencyKeys(url, ttl_s=3600)
    claim = keys.claim("charge:42", task="billing.charge", lease_s=30)
    assert claim.claimed and keys.record(claim, {"charge": "ch_42"})
    return row_id, "charge:42"


def assert_seeded_rows_kept(url: str, seeded: tuple[int, str]) -> None:
    row_id, key = seeded
    row = DeadLetterStore(url).get(row_id)
    assert row is not None and row["args"] == [42] and row["status"] == "dead"
    kept = IdempotencyKeys(url, ttl_s=3600).get(key)
    assert kept is not None and kept["state"] == "done" and kept["result"] == {"charge": "ch_42"}


def test_the_app_runs_its_own_alembic_on_the_platforms_database(
    url: str, app_alembic: AppAlembic
) -> None:
    upgraded = platform(url, "upgrade")
    assert f"is at revision {HEAD}" in upgraded.stdout
    app_alembic("upgrade", "head")  # used to fail: "Can't locate revision identified by '0002'"
    platform(url, "upgrade")  # and back: the app's revision is not in the platform's way
    assert rows(url, OURS) == {HEAD}
    assert rows(url, DEFAULT) == {app_alembic.revision}
    assert {"orders", "dead_letter_jobs", "idempotency_keys"} <= tables(url)
    assert platform(url, "current").stdout.strip() == HEAD

    app_alembic("downgrade", "base")  # the app rolls back its own stream only
    assert "orders" not in tables(url) and rows(url, DEFAULT) == set()
    assert rows(url, OURS) == {HEAD}
    assert {"dead_letter_jobs", "idempotency_keys"} <= tables(url)
    platform(url, "upgrade")
    app_alembic("upgrade", "head")
    assert rows(url, OURS) == {HEAD} and rows(url, DEFAULT) == {app_alembic.revision}


def test_app_revision_ids_like_the_platforms_do_not_collide(url: str, tmp_path: Path) -> None:
    """An app numbering its revisions 0001, 0002... and migrating first."""
    app = AppAlembic(tmp_path / "numbered", url, revision="0001")
    app("upgrade", "head")
    moved = platform(url, "upgrade")
    assert "moved" not in moved.stdout  # the app's 0001 is not taken for the platform's
    assert rows(url, DEFAULT) == {"0001"} and rows(url, OURS) == {HEAD}
    assert {"orders", "dead_letter_jobs", "idempotency_keys"} <= tables(url)
    app("downgrade", "base")
    assert "orders" not in tables(url) and rows(url, OURS) == {HEAD}


def test_autogenerate_sees_only_the_platforms_tables(url: str, app_alembic: AppAlembic) -> None:
    """The platform's env.py must not offer to drop the app's tables (or its alembic_version)."""
    from alembic import command

    platform(url, "upgrade")
    app_alembic("upgrade", "head")
    with db.engine_for(url).begin() as conn:  # and a table no migration knows
        conn.execute(sa.text("CREATE TABLE app_notes (id INTEGER PRIMARY KEY)"))
    command.check(db.alembic_config(url))  # raises when autogenerate finds any difference


def test_a_legacy_database_moves_its_revision_and_keeps_every_row(
    url: str, app_alembic: AppAlembic
) -> None:
    """The issue's state: alembic_version holds the platform's 0002, the app's Alembic crashed
    on it (and wrote nothing)."""
    make_legacy(url)
    seeded = seed(url)
    assert app_alembic("upgrade", "head", ok=False).returncode != 0  # the reported failure

    current = platform(url, "current").stdout
    assert LEGACY in current and "db upgrade" in current  # says the move is pending
    upgraded = platform(url, "upgrade")
    assert f"moved platform revision {LEGACY} from {DEFAULT} to {OURS}" in upgraded.stdout
    assert f"dropped {DEFAULT}" in upgraded.stdout
    assert rows(url, OURS) == {HEAD} and rows(url, DEFAULT) is None
    assert_seeded_rows_kept(url, seeded)

    again = platform(url, "upgrade")  # idempotent
    assert "moved" not in again.stdout and f"is at revision {HEAD}" in again.stdout
    app_alembic("upgrade", "head")  # the app's Alembic works now
    assert rows(url, DEFAULT) == {app_alembic.revision} and rows(url, OURS) == {HEAD}
    assert "moved" not in platform(url, "upgrade").stdout  # the app's row is not ours
    assert_seeded_rows_kept(url, seeded)


def test_a_legacy_alembic_version_shared_with_the_app_keeps_the_apps_row(
    url: str, app_alembic: AppAlembic
) -> None:
    """alembic_version holds the platform's 0002 and the app's revision (an app that
    recorded its own by hand to get past the crash): only the platform's row moves."""
    make_legacy(url, app_alembic.revision)
    with db.engine_for(url).begin() as conn:  # what the app's recorded revision created
        conn.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY, item VARCHAR(50))"))
    seeded = seed(url)
    upgraded = platform(url, "upgrade")
    assert f"moved platform revision {LEGACY} from {DEFAULT} to {OURS}" in upgraded.stdout
    assert f"{DEFAULT} keeps the app's revisions ({app_alembic.revision})" in upgraded.stdout
    assert rows(url, OURS) == {HEAD} and rows(url, DEFAULT) == {app_alembic.revision}
    assert_seeded_rows_kept(url, seeded)
    app_alembic("current")
    app_alembic("downgrade", "base")  # the app's stream is its own again
    assert rows(url, DEFAULT) == set() and rows(url, OURS) == {HEAD}


def start_platform_upgrade(url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks", "db", "upgrade"],
        env={**os.environ, "JOBS_DATABASE_URL": url},
        cwd=str(ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_workers_starting_together_move_a_legacy_revision_once(url: str) -> None:
    """Several ``db upgrade`` at once (workers migrate at start): one move, no failure."""
    make_legacy(url)
    seeded = seed(url)
    procs = [start_platform_upgrade(url) for _ in range(3)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], outputs
    assert sum("moved platform revision" in out for out, _err in outputs) == 1, outputs
    assert rows(url, OURS) == {HEAD} and rows(url, DEFAULT) is None
    assert_seeded_rows_kept(url, seeded)


def test_the_move_waits_for_a_migration_in_progress() -> None:
    """On PostgreSQL the move happens under the platform's migration lock: while another
    migrator holds it, ``db upgrade`` waits and touches nothing."""
    with fresh_pg_database() as url:
        make_legacy(url)
        seeded = seed(url)
        holder = sa.create_engine(url, poolclass=sa.pool.NullPool)
        lock = {"id": db._MIGRATION_LOCK_ID}
        with holder.connect() as conn:
            conn.execute(sa.text("SELECT pg_advisory_lock(:id)"), lock)
            proc = start_platform_upgrade(url)

            def waiting_for_the_lock() -> bool:
                assert proc.poll() is None, proc.communicate()
                return bool(
                    conn.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                            "AND NOT granted AND database = "
                            "(SELECT oid FROM pg_database WHERE datname = current_database())"
                        )
                    ).scalar()
                )

            wait_for(waiting_for_the_lock, timeout_s=60, message="db upgrade to wait for the lock")
            assert rows(url, DEFAULT) == {LEGACY} and rows(url, OURS) is None
            conn.execute(sa.text("SELECT pg_advisory_unlock(:id)"), lock)
            conn.commit()
        holder.dispose()
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, out + err
        assert f"moved platform revision {LEGACY}" in out
        assert rows(url, OURS) == {HEAD} and rows(url, DEFAULT) is None
        assert_seeded_rows_kept(url, seeded)
        db.engine_for(url).dispose()


def test_platform_tables_without_a_recorded_revision_are_refused_clearly(url: str) -> None:
    """An app that deleted the platform's row from alembic_version to get past the crash:
    the platform says how to record it instead of failing on CREATE TABLE."""
    make_legacy(url)
    seeded = seed(url)
    with db.engine_for(url).begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {DEFAULT}"))
    refused = platform(url, "upgrade", ok=False)
    assert refused.returncode == 1
    assert "no platform revision is recorded" in refused.stderr
    assert "db stamp" in refused.stderr and "Traceback" not in refused.stderr
    assert rows(url, OURS) is None and rows(url, DEFAULT) == set()  # nothing changed

    platform(url, "stamp", LEGACY)
    assert "moved" not in platform(url, "upgrade").stdout
    assert rows(url, OURS) == {HEAD} and rows(url, DEFAULT) == set()  # the app's table stays
    assert_seeded_rows_kept(url, seeded)


def test_ambiguous_legacy_rows_change_nothing(url: str) -> None:
    """What cannot be told apart is not guessed: a clear error, and nothing moves."""
    from jobs_platform.errors import ConfigError

    make_legacy(url, "0001")  # the app's 0001 next to the platform's 0002: which is ours?
    with pytest.raises(ConfigError, match="several revisions"):
        db.upgrade(url)
    assert rows(url, DEFAULT) == {LEGACY, "0001"} and rows(url, OURS) is None

    with db.engine_for(url).begin() as conn:  # the platform's 0002, half its tables gone
        conn.execute(sa.text(f"DELETE FROM {DEFAULT} WHERE version_num = '0001'"))
        conn.execute(sa.text("DROP TABLE idempotency_keys"))
    with pytest.raises(ConfigError, match="only some of the tables"):
        db.upgrade(url)
    assert rows(url, DEFAULT) == {LEGACY} and rows(url, OURS) is None
