"""``celery -A APP db ...`` and ``dlq ...`` commands in-process, on a SQLite file."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from types import SimpleNamespace
from typing import Any

import click
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from click.testing import CliRunner

from jobs_platform import create_app, db
from jobs_platform.cli.db import db as db_group
from jobs_platform.cli.dlq import dlq
from jobs_platform.cli.options import parse_since
from jobs_platform.deadletter.model import REASONS
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.store import DeadLetterStore
from tests.support.guards import NO_BROKER

pytestmark = pytest.mark.integration


@pytest.fixture()
def app(sqlite_url: str) -> Any:
    return create_app("clitest", database_url=sqlite_url, broker_url=NO_BROKER)


def run(app: Any, group: Any, *args: str) -> Any:
    return CliRunner().invoke(group, list(args), obj=SimpleNamespace(app=app))


def seed(store: DeadLetterStore, task: str, n: int, **extra: Any) -> list[int]:
    ids = []
    for i in range(n):
        row_id = store.add(
            DeadLetter(
                reason=extra.pop("reason", "exhausted") if i == 0 else "exhausted",
                task_id=str(uuid.uuid4()),
                task_name=task,
                queue="fast",
                errors=[
                    {"type": "builtins.ValueError", "message": f"bad {i}", "at": "t", "attempt": 1}
                ],
                failed_at=dt.datetime.now(dt.UTC) - dt.timedelta(days=extra.get("days", 0)),
                args=[i],
                kwargs={},
                attempts=1,
                chain="c",
                redacted=extra.get("redacted", False),
            )
        )
        assert row_id is not None
        ids.append(row_id)
    return ids


def test_db_upgrade_and_current(app: Any) -> None:
    done = run(app, db_group, "upgrade")
    assert done.exit_code == 0, done.output
    head = ScriptDirectory.from_config(db.alembic_config("sqlite://")).get_current_head()
    assert f"is at revision {head}" in done.output, done.output
    assert run(app, db_group, "current").output.strip() != "(none)"


def test_list_show_stats_as_json(app: Any, sqlite_url: str) -> None:
    run(app, db_group, "upgrade")
    store = DeadLetterStore(sqlite_url)
    ids = seed(store, "a.task", 3) + seed(store, "b.task", 1, reason="permanent")
    listed = run(app, dlq, "list", "--json", "--task", "a.task")
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [r["id"] for r in rows] == sorted(ids[:3], reverse=True)  # newest first
    assert rows[0]["errors"][0]["type"] == "builtins.ValueError"
    assert dt.datetime.fromisoformat(rows[0]["failed_at"]).tzinfo is not None
    assert run(app, dlq, "list").exit_code == 0  # the table renders
    shown = run(app, dlq, "show", str(ids[3]))
    assert shown.exit_code == 0 and "b.task" in shown.output and "ValueError" in shown.output
    assert run(app, dlq, "show", "999999").exit_code == 1
    stats = json.loads(run(app, dlq, "stats", "--json").stdout)
    assert stats["total"] == 4
    assert stats["by_task"][0] == {"task_name": "a.task", "count": 3}
    assert run(app, dlq, "stats").exit_code == 0


def test_stats_exact_and_recount_agree_with_the_counts(app: Any, sqlite_url: str) -> None:
    run(app, db_group, "upgrade")
    store = DeadLetterStore(sqlite_url)
    seed(store, "a.task", 3)
    seed(store, "b.task", 2, reason="permanent")
    counted = json.loads(run(app, dlq, "stats", "--json").stdout)
    exact = json.loads(run(app, dlq, "stats", "--json", "--exact").stdout)
    assert counted == exact and counted["total"] == 5
    with store.engine.begin() as conn:  # counts damaged by something that skips triggers
        conn.execute(sa.text("DELETE FROM dead_letter_counts"))
    assert json.loads(run(app, dlq, "stats", "--json").stdout)["total"] == 0
    done = run(app, dlq, "recount")
    assert done.exit_code == 0 and "recounted 5 row(s) into 3 group(s)" in done.output, done.output
    assert json.loads(run(app, dlq, "stats", "--json").stdout) == exact


def test_stats_on_a_database_one_revision_behind_reads_the_rows(app: Any, sqlite_url: str) -> None:
    """A CLI of this release against a database its workers have not migrated yet
    (JOBS_AUTO_MIGRATE=0, no db upgrade): stats still answer, from the rows."""
    db.upgrade(sqlite_url, "0002")
    seed(DeadLetterStore(sqlite_url), "a.task", 2)
    stats = run(app, dlq, "stats", "--json")
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["by_task"] == [{"task_name": "a.task", "count": 2}]


def test_discard_needs_a_reason_and_dry_run_changes_nothing(app: Any, sqlite_url: str) -> None:
    run(app, db_group, "upgrade")
    store = DeadLetterStore(sqlite_url)
    ids = seed(store, "a.task", 3)
    refused = run(app, dlq, "discard", str(ids[0]))
    assert refused.exit_code == 2 and "Missing option '--reason'" in refused.output
    assert run(app, dlq, "discard", str(ids[0]), "--reason", "  ").exit_code == 2
    assert run(app, dlq, "discard", "--reason", "x").exit_code == 2  # no IDs, no filter
    dry = run(app, dlq, "discard", "--task", "a.task", "--reason", "dup", "--dry-run")
    assert dry.exit_code == 0 and "would discard 3" in dry.output
    dry = run(app, dlq, "replay", "--task", "a.task", "--reason", "fixed", "--dry-run", "--json")
    assert [json.loads(line)["outcome"] for line in dry.stdout.splitlines()] == ["would_replay"] * 3
    assert store.count() == 3 and all(r["status"] == "dead" for r in store.listing())
    done = run(app, dlq, "discard", "--task", "a.task", "--reason", "duplicates", "--actor", "ann")
    assert done.exit_code == 0 and "discarded 3 of 3" in done.output
    row = store.get(ids[0])
    assert row is not None
    assert (row["status"], row["resolution_reason"], row["resolved_by"]) == (
        "discarded",
        "duplicates",
        "ann",
    )


def test_replay_refuses_redacted_rows_unless_allowed(app: Any, sqlite_url: str) -> None:
    run(app, db_group, "upgrade")
    store = DeadLetterStore(sqlite_url)
    [row_id] = seed(store, "a.task", 1, redacted=True)
    out = run(app, dlq, "replay", str(row_id), "--reason", "fixed", "--dry-run", "--json")
    assert out.exit_code == 1  # a refusal, even in a dry run
    assert json.loads(out.stdout)["outcome"] == "refused"
    out = run(
        app,
        dlq,
        "replay",
        str(row_id),
        "--reason",
        "fixed",
        "--dry-run",
        "--json",
        "--allow-redacted",
    )
    assert out.exit_code == 0
    assert json.loads(out.stdout)["outcome"] == "would_replay"


def test_purge_keeps_unresolved_rows_unless_asked(app: Any, sqlite_url: str) -> None:
    run(app, db_group, "upgrade")
    store = DeadLetterStore(sqlite_url)
    old = seed(store, "a.task", 2, days=40)
    store.discard([old[0]], reason="x", actor="ann")
    unjustified = run(app, dlq, "purge", "--older-than", "30d")
    assert unjustified.exit_code == 2 and "--reason" in unjustified.stderr
    why = ("--reason", "retention", "--actor", "cron")
    out = run(app, dlq, "purge", "--older-than", "30d", *why)
    assert out.exit_code == 0 and "deleted 1 row" in out.output
    assert "(reason: retention; by cron)" in out.output
    assert store.get(old[0]) is None and store.get(old[1]) is not None
    everything = run(app, dlq, "purge", "--older-than", "30d", "--include-dead", *why)
    assert "deleted 1 row" in everything.output
    assert run(app, dlq, "purge", "--older-than", "soon", *why).exit_code == 2


def test_parse_since() -> None:
    now = dt.datetime.now(dt.UTC)
    assert abs((now - parse_since("2h")).total_seconds() - 7200) < 5  # type: ignore[operator]
    assert parse_since("2026-01-02T03:04:05") == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert parse_since(None) is None


def test_reading_commands_never_migrate_and_say_how_to(app: Any, sqlite_url: str) -> None:
    for args in (["list"], ["show", "1"], ["stats"], ["list", "--json"]):
        done = run(app, dlq, *args)
        assert done.exit_code == 1, (args, done.output)
        assert "celery -A APP db upgrade" in done.output, done.output
    engine = DeadLetterStore(sqlite_url).engine
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == []  # nothing was created
    assert run(app, db_group, "upgrade").exit_code == 0
    assert run(app, dlq, "list", "--json").exit_code == 0


def test_one_option_name_per_meaning() -> None:
    """``--failure-reason`` is the only filter by why a job died; ``--reason`` only justifies."""
    selecting = {"list", "stats", "replay", "discard"}
    for name, command in dlq.commands.items():
        options = {opt: p for p in command.params for opt in p.opts}
        if name in selecting:
            failure = options["--failure-reason"]
            assert isinstance(failure.type, click.Choice), name
            assert tuple(failure.type.choices) == REASONS, name
        else:
            assert "--failure-reason" not in options, name
        reason = options.get("--reason")
        if name in ("replay", "discard", "purge"):
            assert reason is not None and reason.required and not reason.hidden, name
        elif reason is not None:  # the old filter name: hidden, and only an error
            assert isinstance(reason, click.Option) and reason.hidden, name
            assert not reason.expose_value, name
