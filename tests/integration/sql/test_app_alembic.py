"""An application's own Alembic next to the platform's tables, on real PostgreSQL and SQLite:
its autogenerate proposes no change to them with the docs/deploy.md recipe; and ``db
upgrade`` on a half-migrated database says what it found and which ``db stamp`` to run.

Also in ``make lowest`` (the lowest supported Alembic and SQLAlchemy).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import alembic as alembic_package
import pytest
import sqlalchemy as sa

from jobs_platform import db
from tests.integration.sql.test_migrations import HEAD, OURS, platform, rows, tables, url

__all__ = ["url"]  # the fixture: a new, empty database per test, SQLite and PostgreSQL

pytestmark = pytest.mark.integration

MODELS = """
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)
    item: Mapped[str] = mapped_column(sa.String(50))
"""

# docs/deploy.md's env.py, as an application writes it.
ENV = """
from alembic import context
from sqlalchemy import engine_from_config, pool

from jobs_platform.tables import include_name
from myapp.models import Base

config = context.config
section = config.get_section(config.config_ini_section)
engine = engine_from_config(section, prefix="sqlalchemy.", poolclass=pool.NullPool)
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        include_name={include_name},
    )
    with context.begin_transaction():
        context.run_migrations()
"""

ORDERS = """
import sqlalchemy as sa
from alembic import op

revision = "a1"
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


def application(home: Path, database: str, include_name: str) -> Path:
    """An application's package and Alembic environment (default ``alembic_version``)."""
    (home / "myapp").mkdir(parents=True)
    (home / "myapp" / "__init__.py").write_text("")
    (home / "myapp" / "models.py").write_text(textwrap.dedent(MODELS))
    versions = home / "migrations" / "versions"
    versions.mkdir(parents=True)
    env = textwrap.dedent(ENV).replace("{include_name}", include_name)
    (home / "migrations" / "env.py").write_text(env)
    (versions / "a1_orders.py").write_text(textwrap.dedent(ORDERS))
    template = Path(alembic_package.__file__).parent / "templates" / "generic" / "script.py.mako"
    (home / "migrations" / "script.py.mako").write_text(template.read_text())  # `alembic init`'s
    ini = home / "alembic.ini"
    ini.write_text(
        "[alembic]\n"
        f"script_location = {home / 'migrations'}\n"
        f"sqlalchemy.url = {database.replace('%', '%%')}\n"
    )
    return ini


def alembic(ini: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "alembic", "-c", str(ini), *args],
        cwd=ini.parent,
        env={"PYTHONPATH": str(ini.parent), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_apps_autogenerate_proposes_nothing_for_the_platforms_tables(
    url: str, tmp_path: Path
) -> None:
    platform(url, "upgrade")
    ini = application(tmp_path / "app", url, include_name="include_name")
    done = alembic(ini, "upgrade", "head")
    assert done.returncode == 0, done.stderr
    before = tables(url)
    assert {"orders", "dead_letter_jobs", "idempotency_keys", OURS} <= before

    done = alembic(ini, "revision", "--autogenerate", "-m", "next")
    assert done.returncode == 0, done.stderr
    [generated] = [p for p in (tmp_path / "app" / "migrations" / "versions").glob("*next.py")]
    text = generated.read_text()
    upgrade = text[text.index("def upgrade()") : text.index("def downgrade()")]
    assert "op." not in upgrade, upgrade  # nothing to drop, alter or create
    for name in ("dead_letter_jobs", "idempotency_keys", OURS):
        assert name not in text
    generated.unlink()
    check = alembic(ini, "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "No new upgrade operations detected" in check.stdout + check.stderr
    assert tables(url) == before and rows(url, OURS) == {HEAD}


def test_without_the_recipe_autogenerate_would_drop_the_dead_letter_table(
    url: str, tmp_path: Path
) -> None:
    """The defect the recipe prevents, seen by the same test environment (so the test above
    cannot pass by comparing nothing)."""
    platform(url, "upgrade")
    ini = application(tmp_path / "app", url, include_name="None")
    assert alembic(ini, "upgrade", "head").returncode == 0
    check = alembic(ini, "check")
    assert check.returncode != 0
    assert "remove_table" in check.stdout + check.stderr
    assert "dead_letter_jobs" in check.stdout + check.stderr


def test_a_half_migrated_database_is_refused_in_one_paragraph_with_the_stamp_to_run(
    url: str,
) -> None:
    """It used to end in the driver's DuplicateTable traceback."""
    platform(url, "upgrade")
    platform(url, "stamp", "0001")  # the version table behind the tables it describes
    assert rows(url, OURS) == {"0001"}
    refused = platform(url, "upgrade", ok=False)
    assert refused.returncode == 1
    out = refused.stdout + refused.stderr
    assert "Traceback" not in out and "DuplicateTable" not in out
    [paragraph] = [line for line in refused.stderr.splitlines() if line.strip()]
    assert paragraph.startswith("Error: the platform's database at ")
    later = ", ".join(
        sorted(t for rev, names in db.CREATES.items() if rev != "0001" for t in names)
    )
    assert f"is half-migrated: {OURS} records 0001, but {later}" in paragraph
    assert f"`celery -A APP db stamp {HEAD}`" in paragraph
    assert rows(url, OURS) == {"0001"}  # nothing was changed

    platform(url, "stamp", HEAD)
    assert f"is at revision {HEAD}" in platform(url, "upgrade").stdout

    with sa.create_engine(url, poolclass=sa.pool.NullPool).begin() as conn:  # no row at all
        conn.execute(sa.text(f"DELETE FROM {OURS}"))
    refused = platform(url, "upgrade", ok=False)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    created = ", ".join(sorted(t for names in db.CREATES.values() for t in names))
    assert f"{OURS} records no revision, but {created}" in refused.stderr
    assert f"db stamp {HEAD}" in refused.stderr


def test_every_revision_names_the_tables_it_creates() -> None:
    """The half-migrated check reads db.CREATES: a revision missing there would be stamped
    past tables it never made."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db.alembic_config("sqlite://"))
    assert set(db.CREATES) == {s.revision for s in script.walk_revisions()}
