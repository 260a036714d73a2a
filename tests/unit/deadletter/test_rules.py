"""Pure rules of the capture and replay paths: what is made storable, which database errors
are an outage, which headers a replay may send, and what ``import jobs_platform`` loads."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import sqlalchemy as sa
import sqlalchemy.exc

from jobs_platform.deadletter.model import DeadLetterJob
from jobs_platform.deadletter.record import COLUMN_LENGTHS, DeadLetter
from jobs_platform.deadletter.replay import replay_headers
from jobs_platform.deadletter.sink import is_transient
from jobs_platform.history import REPLAY_OF_HEADER
from jobs_platform.testing import dead_letter


def letter(**overrides: Any) -> DeadLetter:
    return dead_letter(**{"reason": "poison", "task_id": "t-1", **overrides})


def test_column_lengths_are_the_models() -> None:
    # record.py stays free of SQLAlchemy, so its copy of the limits is checked here.
    table: sa.Table = DeadLetterJob.__table__  # type: ignore[assignment]
    filled = letter().row()
    model = {
        column.name: column.type.length
        for column in table.columns
        if isinstance(column.type, sa.String) and column.type.length and column.name in filled
    }
    assert model == COLUMN_LENGTHS


def test_row_cuts_strings_to_their_columns_and_strips_nul() -> None:
    row = letter(
        task_id="i" * 300,
        task_name="n\u0000" * 300,
        queue="q" * 300,
        worker="w" * 300,
        content_encoding="e" * 100,
        args=["\u0000", {"\u0000key": ["x\u0000"]}, 3, None],
        kwargs={"s": "\ud800lone"},
        errors=[{"type": "T" * 400, "message": "a\u0000b", "at": "x", "attempt": 1}],
    ).row()
    assert row["task_name"] == "n" * 255 and len(row["task_id"]) == 255
    assert len(row["queue"]) == len(row["worker"]) == 255 and len(row["content_encoding"]) == 64
    assert row["args"] == ["", {"key": ["x"]}, 3, None]
    assert row["kwargs"] == {"s": "?lone"}
    assert len(row["error_type"]) == 255 and row["error_message"] == "ab"
    assert row["errors"][0]["message"] == "ab"


@pytest.mark.parametrize(
    ("priority", "stored"),
    [(5, 5), ("7", 7), ("high", None), (True, None), (2**40, None), (1.5, None), (None, None)],
)
def test_row_coerces_priority_to_an_integer_or_none(priority: Any, stored: int | None) -> None:
    assert letter(priority=priority).row()["priority"] == stored


class _Orig(Exception):
    def __init__(self, sqlstate: str | None) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _dbapi(cls: type[sqlalchemy.exc.DBAPIError], sqlstate: str | None) -> BaseException:
    return cls("INSERT ...", {}, _Orig(sqlstate))


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        # the database is unreachable, overloaded or not ready: keep it spooled
        (_dbapi(sqlalchemy.exc.OperationalError, None), True),  # refused, SQLite locked
        (_dbapi(sqlalchemy.exc.OperationalError, "08006"), True),
        (_dbapi(sqlalchemy.exc.OperationalError, "57P01"), True),  # admin shutdown
        (_dbapi(sqlalchemy.exc.InterfaceError, None), True),
        (_dbapi(sqlalchemy.exc.ProgrammingError, "42P01"), True),  # table not migrated yet
        (sqlalchemy.exc.DisconnectionError(), True),
        (sqlalchemy.exc.TimeoutError(), True),  # pool exhausted
        (ConnectionRefusedError(), True),
        # this row will never be accepted: move it aside
        (_dbapi(sqlalchemy.exc.IntegrityError, "23503"), False),  # FK
        (_dbapi(sqlalchemy.exc.IntegrityError, None), False),  # SQLite
        (_dbapi(sqlalchemy.exc.DataError, "22P05"), False),  # \u0000 in JSONB
        (_dbapi(sqlalchemy.exc.DataError, "22001"), False),  # too long
        (_dbapi(sqlalchemy.exc.OperationalError, "54000"), False),  # JSONB too large
        (_dbapi(sqlalchemy.exc.ProgrammingError, None), False),  # cannot adapt a value
        (TypeError("not JSON serializable"), False),
        (ValueError("bad"), False),
    ],
)
def test_only_outages_are_transient(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def test_replay_headers_keep_only_the_jobs_own_headers() -> None:
    raw = {
        # Celery's protocol headers of the *old* message (a poison row keeps them all)
        "lang": "py",
        "task": "billing.charge",
        "id": "old-id",
        "root_id": "old-id",
        "parent_id": None,
        "group": None,
        "group_index": None,
        "retries": 4,
        "eta": "2026-01-01T00:00:00+00:00",
        "expires": "2026-01-01T00:00:00+00:00",
        "timelimit": [10, 5],
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": "gen1@host",
        "shadow": None,
        "ignore_result": False,
        "stamped_headers": ["x"],
        "stamps": {"x": 1},
        "replaced_task_nesting": 0,
        "compression": "zlib",
        # the failed chain
        "jobs_errors": [{"type": "E"}],
        "jobs_enqueued_at": "2026-01-01T00:00:00+00:00",
        REPLAY_OF_HEADER: 3,
        # the job's own
        "tenant": "acme",
        "x-trace": "abc",
    }
    assert replay_headers(raw) == {"tenant": "acme", "x-trace": "abc"}
    assert replay_headers(None) == {}


def test_importing_the_platform_loads_no_sqlalchemy_from_the_dead_letter_package() -> None:
    # ``import jobs_platform`` and create_app() (which installs the dead-letter receivers and
    # bootstep) must not make the dead-letter package import SQLAlchemy: only a failure, a
    # worker start or the CLI does. (The idempotency package imports it on its own.)
    probe = textwrap.dedent(
        """
        import builtins, traceback
        original = builtins.__import__
        culprits = set()

        def spy(name, *args, **kwargs):
            if name.split(".")[0] == "sqlalchemy":
                for frame in traceback.extract_stack()[:-1]:
                    if "jobs_platform/deadletter/" in frame.filename.replace("\\\\", "/"):
                        culprits.add(f"{frame.filename}:{frame.lineno}")
            return original(name, *args, **kwargs)

        builtins.__import__ = spy
        import jobs_platform
        from jobs_platform.deadletter import CONSUMER, DeadLetter, install

        jobs_platform.create_app("probe", broker_url="redis://127.0.0.1:6379/0")  # never connects
        print(sorted(culprits))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
