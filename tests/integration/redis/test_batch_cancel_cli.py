"""`celery -A APP batch cancel` (click's runner) on PostgreSQL and SQLite with the real
coordination Redis: a cancel deletes the batch's open mark there before it commits
(jobs_platform.batches.marks), so it needs Redis; the other batch commands are tested in
tests/integration/sql/test_batch_cli.py, whose fixtures this file shares."""

from __future__ import annotations

from typing import Any

import pytest

from jobs_platform import create_app
from tests.integration.sql.test_batch_cli import db_url, run, seeded, shown

pytestmark = pytest.mark.integration

__all__ = ["db_url", "seeded"]  # fixtures, used by name


@pytest.fixture()
def app(db_url: str, redis_url: str) -> Any:
    return create_app("batchcancel", database_url=db_url, broker_url=redis_url)


def test_cancel_needs_a_reason_and_keeps_the_first(app: Any, seeded: dict[str, Any]) -> None:
    blank = run(app, "cancel", seeded["running"], "--reason", "  ")
    assert blank.exit_code == 2 and "give a reason" in blank.output
    done = run(app, "cancel", seeded["running"], "--reason", "INC-9")
    assert done.exit_code == 0 and done.stdout == f"batch {seeded['running']} cancelled\n"
    again = run(app, "cancel", seeded["running"], "--reason", "other")
    assert again.exit_code == 0 and "was already cancelled" in again.stdout
    data = shown(app, seeded["running"])
    assert (data["status"], data["cancel_reason"], data["pending"]) == ("cancelled", "INC-9", 2)
