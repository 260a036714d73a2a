"""A real worker started on a database an older release migrated (the rolling-deploy path).

Workers apply the platform's migrations at start: the first new worker moves the platform's
revision out of ``alembic_version``, keeps every row, and leaves that table to the app.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs_platform import db
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT
from tests.conftest import fresh_pg_database
from tests.integration.sql.test_migrations import (
    DEFAULT,
    HEAD,
    LEGACY,
    OURS,
    AppAlembic,
    assert_seeded_rows_kept,
    make_legacy,
    rows,
    seed,
)

pytestmark = pytest.mark.acceptance


@pytest.fixture()
def legacy_url() -> Iterator[str]:
    with fresh_pg_database() as url:
        make_legacy(url)
        yield url
        db.engine_for(url).dispose()  # before the database is dropped


def test_a_starting_worker_moves_the_legacy_revision_and_frees_alembic_version(
    legacy_url: str, redis_url: str, tmp_path: Path
) -> None:
    seeded = seed(legacy_url)
    env = {
        "JOBS_BROKER_URL": redis_url,
        "JOBS_DATABASE_URL": legacy_url,
        "PYTHONPATH": str(ROOT),
    }
    with WorkerProcess(
        "tests.support.dlq_app", ["fast"], env=env, cwd=str(ROOT), log_dir=str(tmp_path)
    ) as worker:
        wait_for(
            lambda: rows(legacy_url, OURS) == {HEAD},
            timeout_s=30,
            message=lambda: f"the platform's version table:\n{worker.log()[-2000:]}",
        )
        assert rows(legacy_url, DEFAULT) is None
        # The legacy layout is one revision behind: moved as it was, then upgraded.
        assert f"moved platform revision {LEGACY} from {DEFAULT} to {OURS}" in worker.log()
        assert_seeded_rows_kept(legacy_url, seeded)

        app = AppAlembic(tmp_path / "app", legacy_url, revision="a1b2c3d4e5f6")
        app("upgrade", "head")  # the app's own Alembic, next to the running worker
        assert rows(legacy_url, DEFAULT) == {app.revision}
        assert rows(legacy_url, OURS) == {HEAD}
