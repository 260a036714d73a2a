"""delay_on_commit's refusals at the call and the database comparison behind the session
check (pure; a SQLite file under tmp_path, memory:// broker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from jobs_platform import ConfigError, DispatchError, ReliableTask, create_app
from jobs_platform.db import upgrade
from jobs_platform.outbox.database import same_database
from jobs_platform.outbox.model import job_outbox


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("postgresql+psycopg://app:pw@db/jobs", "postgresql://jobs@db:5432/jobs", True),
        ("postgresql://localhost/jobs", "postgresql://127.0.0.1:5432/jobs", True),
        ("postgresql://db/jobs", "postgresql://db/other", False),
        ("postgresql://db/jobs", "postgresql://db:6432/jobs", False),
        ("postgresql://db/jobs", "postgresql://replica/jobs", False),
        ("sqlite:///x.sqlite3", "postgresql://db/x", False),
        ("sqlite://", "sqlite://", False),  # in-memory: private to its connection
        ("sqlite:///:memory:", "sqlite:///:memory:", False),
    ],
)
def test_same_database(a: str, b: str, same: bool) -> None:
    assert same_database(a, b) is same


def test_sqlite_files_compare_by_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert same_database("sqlite:///jobs.sqlite3", f"sqlite:///{tmp_path}/jobs.sqlite3")
    assert not same_database("sqlite:///jobs.sqlite3", f"sqlite:///{tmp_path}/other.sqlite3")


@pytest.fixture()
def app(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path}/jobs.sqlite3"
    upgrade(url)
    app = create_app(
        "outboxunit", broker_url="memory://", result_backend="cache+memory://", database_url=url
    )

    @app.task(base=ReliableTask, bind=True, queue="fast", name="t.plain")
    def plain(self: Any, n: int) -> None: ...

    @app.task(base=ReliableTask, bind=True, queue="fast", name="t.debounced", debounce=2)
    def debounced(self: Any, n: int) -> None: ...

    @app.task(
        base=ReliableTask,
        bind=True,
        queue="fast",
        name="t.keyed",
        concurrency_key=lambda account: f"acct:{account['id']}",
        concurrency_limit=1,
    )
    def keyed(self: Any, account: dict[str, Any]) -> None: ...

    @app.task(
        base=ReliableTask,
        bind=True,
        queue="fast",
        name="t.unique",
        business_key=("order_id",),
        unique_for=60,
    )
    def once(self: Any, order_id: int) -> None: ...

    return app


def written(app: Any) -> int:
    engine = sa.create_engine(app.jobs_settings.database_url)
    with engine.connect() as conn:
        count = int(conn.execute(sa.select(sa.func.count()).select_from(job_outbox)).scalar_one())
    engine.dispose()
    return count


@pytest.mark.parametrize(
    ("name", "call", "words"),
    [
        ("t.debounced", lambda t, s: t.delay_on_commit(s, 1), "debounced task"),
        ("t.keyed", lambda t, s: t.delay_on_commit(s, {"name": "x"}), "concurrency_key"),
        ("t.plain", lambda t, s: t.apply_async_on_commit(s, (1,), expires=10), "expires"),
        ("t.plain", lambda t, s: t.apply_async_on_commit(s, (1,), headers={"x": {1}}), "JSON"),
    ],
)
def test_refused_at_the_call_with_nothing_written(
    app: Any, name: str, call: Any, words: str
) -> None:
    with Session(sa.create_engine(app.jobs_settings.database_url)) as session:
        with pytest.raises(DispatchError, match=words):
            call(app.tasks[name], session)
        session.commit()
    assert written(app) == 0


def test_a_unique_task_is_one_row_per_call_with_its_own_id(app: Any) -> None:
    # No lock: a lock taken at the call would outlive a rollback (docs/outbox.md).
    with Session(sa.create_engine(app.jobs_settings.database_url)) as session:
        first = app.tasks["t.unique"].delay_on_commit(session, 7)
        second = app.tasks["t.unique"].delay_on_commit(session, 7)
        session.commit()
    assert first.id != second.id and written(app) == 2


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ({"outbox_relay_interval": 0}, "outbox_relay_interval"),
        ({"outbox_relay_batch": 0}, "outbox_relay_batch"),
        ({"outbox_retention": -1}, "outbox_retention"),
    ],
)
def test_outbox_settings_are_checked(override: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        create_app("bad", broker_url="memory://", **override)
