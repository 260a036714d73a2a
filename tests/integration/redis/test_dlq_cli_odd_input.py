"""The odd-input cases of ``dlq`` and ``delayed`` that need the broker (SQLite, PostgreSQL,
Redis): a replay refuses arguments Celery cannot send and goes on with the other rows, and
the delayed store's commands refuse bytes Redis cannot take and print what it holds escaped.
The cases on the databases alone: tests/integration/sql/test_dlq_cli_odd_input.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result

from jobs_platform import create_app
from jobs_platform.cli.delayed import delayed
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import RedisServer
from tests.integration.sql import test_dlq_cli_odd_input as on_sql
from tests.integration.sql.test_dlq_cli_odd_input import EVIL, died_of, run
from tests.support.delayed_app import make_app as make_delayed_app

pytestmark = pytest.mark.integration

# The same fixtures as the database-only cases: a migrated SQLite file and PostgreSQL database
# of this module's own, and their dead-letter store.
database = on_sql.database
store = on_sql.store


@pytest.fixture(scope="module")
def app(database: str, redis_url: str) -> Any:
    return create_app("oddcli", database_url=database, broker_url=redis_url)


def test_a_letter_with_arguments_celery_cannot_send_is_refused_and_the_replay_goes_on(
    app: Any, store: DeadLetterStore
) -> None:
    odd = store.add(died_of("abc", {}))
    good = store.add(died_of([1], {}))
    assert odd is not None and good is not None
    result = run(app, "replay", str(odd), str(good), "--reason", "odd args", "--json")
    assert result.exit_code == 1, result.output  # 1: a row was refused
    outcomes = {r["id"]: r for r in listed_lines(result)}
    assert "not a list" in outcomes[odd]["why"], outcomes[odd]
    odd_row, good_row = store.get(odd), store.get(good)
    assert odd_row is not None and odd_row["status"] == "dead"
    assert good_row is not None and good_row["status"] == "replayed"


def listed_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


# -- the delayed store (Redis) reads the same way --------------------------------------------


@pytest.fixture(scope="module")
def delayed_app() -> Iterator[Any]:
    with RedisServer() as server:
        yield make_delayed_app(broker_url=server.url)


def test_delayed_commands_refuse_bytes_redis_cannot_take_and_print_escaped(
    delayed_app: Any,
) -> None:
    def run_delayed(*args: str) -> Result:
        return CliRunner().invoke(delayed, list(args), obj=SimpleNamespace(app=delayed_app))

    for args, name in (
        (["show", "caf\udce9"], "TASK_ID"),
        (["cancel", "ok", "caf\udce9", "--reason=x"], "TASK_IDS"),
        (["list", "--task=\udcff"], "--task"),
        (["list", "--queue=\udcff"], "--queue"),
        (["cancel", "ok", "--reason=\udcff"], "--reason"),
    ):
        done = run_delayed(*args)
        assert done.exit_code == 2, (args, done.output, done.exception)
        assert name in done.output and "not valid UTF-8" in done.output

    task_id = str(
        delayed_app.send_task(
            EVIL, args=[EVIL], countdown=3600, queue="fast", ignore_result=True
        ).id
    )
    for args in (["list", f"--task={EVIL}"], ["show", task_id], ["cancel", task_id, "--reason=x"]):
        done = run_delayed(*args)
        assert done.exit_code == 0, (args, done.output)
        assert "\x1b" not in done.output and "\\x1b]0;owned" in done.output, (args, done.output)
    missing = run_delayed("show", f"gone{EVIL}")
    assert missing.exit_code == 1 and "\x1b" not in missing.output
