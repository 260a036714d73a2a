"""``dlq`` filters and reasons take odd and injection-like text safely (SQLite, PostgreSQL).

Hypothesis drives the real commands (in-process, through click) with SQL meta-characters,
quotes, LIKE wildcards, very long and non-ASCII text: a filter matches exactly the rows
holding that value, a justification is stored as given, and the table is never harmed.
NUL and text that is not UTF-8 cannot be stored at all: a usage error (exit 2), also from
the real ``celery`` command given bytes that are not UTF-8. What a message stored (task
name, error, traceback, raw body, arguments of any JSON shape) is printed escaped: it
cannot drive the operator's terminal, fake a line or be read as rich markup.

What needs the broker (a replay, the delayed store's commands) is in
tests/integration/redis/test_dlq_cli_odd_input.py.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs_platform import create_app, db
from jobs_platform.cli.dlq import dlq
from jobs_platform.deadletter.letters import failure_letter
from jobs_platform.deadletter.model import REASONS
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.store import DeadLetterStore
from tests.conftest import fresh_pg_database
from tests.support.guards import NO_BROKER

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
CELERY_DLQ = [sys.executable, "-m", "celery", "-A", "tests.support.dlq_app", "dlq"]

INJECTIONS = [
    "x'; DROP TABLE dead_letter_jobs; --",
    "' OR '1'='1",
    '" OR ""="',
    "%",
    "_",
    "\\",
    "`; SELECT pg_sleep(10); --",
    "$$; DELETE FROM dead_letter_jobs; $$",
    "-x",
    "",
    " ",
    "名前.タスク",
    "\U0001f4a5",
    "é" * 255,
    "a\r\nb\tc",
]
#: Text a database can hold: no NUL, no lone surrogate.
STORABLE = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
ODD = st.one_of(st.sampled_from(INJECTIONS), st.text(STORABLE, max_size=255))
EXAMPLES = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('odd')}/jobs.sqlite3"
        db.upgrade(url)
        yield url
        return
    with fresh_pg_database() as url:
        db.upgrade(url)
        yield url


@pytest.fixture(scope="module")
def app(database: str) -> Any:
    return create_app("oddcli", database_url=database, broker_url=NO_BROKER)


@pytest.fixture(scope="module")
def store(database: str) -> DeadLetterStore:
    return DeadLetterStore(database)


def run(app: Any, *args: str) -> Result:
    return CliRunner().invoke(dlq, list(args), obj=SimpleNamespace(app=app))


def seed(
    store: DeadLetterStore,
    *,
    task: str = "t.x",
    queue: str = "fast",
    text: str = "bad",
    **more: Any,
) -> int:
    """A dead letter; ``text`` is its error message (and ``more`` any other field)."""
    row_id = store.add(
        DeadLetter(
            reason="exhausted",
            task_id=str(uuid.uuid4()),
            task_name=task,
            queue=queue,
            errors=[{"type": "builtins.ValueError", "message": text, "at": "t", "attempt": 1}],
            failed_at=dt.datetime.now(dt.UTC),
            args=[1],
            kwargs={},
            attempts=1,
            chain=uuid.uuid4().hex,
            **more,
        )
    )
    assert row_id is not None
    return row_id


def listed(result: Result) -> list[dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@EXAMPLES
@given(value=ODD)
def test_a_filter_matches_exactly_the_rows_holding_that_value(
    app: Any, store: DeadLetterStore, value: str
) -> None:
    before = store.count()
    row_id = seed(store, task=value, queue=value)
    for option, column in (("--task", "task_name"), ("--queue", "queue")):
        rows = listed(run(app, "list", f"{option}={value}", "--json", "--page-size", "1000"))
        assert row_id in [r["id"] for r in rows]
        assert {r[column] for r in rows} == {value}
    assert listed(run(app, "list", f"--fingerprint={value}", "--json")) == []
    stats = run(app, "stats", f"--task={value}")
    assert stats.exit_code == 0, stats.output
    assert store.count() == before + 1  # nothing dropped, nothing deleted


@EXAMPLES
@given(reason=ODD.filter(lambda r: bool(r.strip()) and r.strip() not in REASONS))
def test_a_justification_is_stored_as_given(app: Any, store: DeadLetterStore, reason: str) -> None:
    row_id = seed(store)
    done = run(app, "discard", str(row_id), f"--reason={reason}", f"--actor={reason}")
    assert done.exit_code == 0, done.output
    row = store.get(row_id)
    assert row is not None
    assert (row["status"], row["resolution_reason"]) == ("discarded", reason.strip())


@EXAMPLES
@given(value=ODD)
def test_an_odd_since_is_a_usage_error_or_a_time_never_a_crash(app: Any, value: str) -> None:
    done = run(app, "list", f"--since={value}", "--json")
    assert done.exit_code in (0, 2), done.output
    assert done.exception is None or isinstance(done.exception, SystemExit)


UNSTORABLE = ["x\x00y", "\x00", "\udcff", "caf\udce9"]  # NUL; bytes that were not UTF-8


@pytest.mark.parametrize("value", UNSTORABLE)
@pytest.mark.parametrize(
    "option", ["--task", "--queue", "--fingerprint", "--since", "--reason", "--actor"]
)
def test_text_no_database_can_hold_is_a_usage_error(
    app: Any, store: DeadLetterStore, option: str, value: str
) -> None:
    row_id = seed(store)
    if option in ("--reason", "--actor"):
        given = {"--reason": "INC-7", "--actor": "ann", option: value}
        done = run(app, "discard", str(row_id), *(f"{k}={v}" for k, v in given.items()))
    else:
        done = run(app, "list", f"{option}={value}")
    assert done.exit_code == 2, (done.output, done.exception)
    assert option in done.output
    assert store.get(row_id)["status"] == "dead"  # type: ignore[index]


EVIL = "poison\x1b]0;owned\x07\x1b[2J"  # set the window title, clear the screen
#: Stored text rich would read as markup or emoji codes if it were handed a str.
MARKUP = "[bold red]loud[/bold red] [link=http://x]y[/link] :smile:"
#: A one-line value must not fake a line of its own, or reorder what the operator reads.
FORGED = "t.ok\n1  2026-01-01 00:00:00  t.fake  fast\u202eexe.kcatta"


def test_stored_text_cannot_drive_the_operators_terminal(app: Any, store: DeadLetterStore) -> None:
    row_id = seed(
        store,
        task=EVIL,
        text=f"boom {EVIL}",
        traceback=f"Traceback (most recent call last):\n  {EVIL}\nValueError: {EVIL}",
        raw_body=f'{{"task": "{EVIL}"}}',
        raw_body_encoding="utf-8",
        content_type="application/json\x1b[5m",
    )
    for args in (["list", f"--task={EVIL}"], ["show", str(row_id)], ["stats", f"--task={EVIL}"]):
        done = run(app, *args)
        assert done.exit_code == 0, done.output
        assert "\x1b" not in done.output and "\x07" not in done.output, args
        assert "\\x1b]0;owned\\x07\\x1b[2J" in done.output, (args, done.output)
    shown = run(app, "show", str(row_id)).output
    assert "boom poison\\x1b" in shown and "ValueError: poison\\x1b" in shown  # traceback
    assert "application/json\\x1b[5m" in shown


def test_stored_markup_and_line_breaks_print_as_they_are(app: Any, store: DeadLetterStore) -> None:
    row_id = seed(store, task=MARKUP, queue=FORGED, text=MARKUP)
    listing = run(app, "list", f"--task={MARKUP}")
    shown = run(app, "show", str(row_id))
    for done in (listing, shown):
        assert done.exit_code == 0, done.output
        assert "\u202e" not in done.output
        assert "t.ok\\x0a1  2026" in done.output and "\\u202eexe" in done.output
    assert MARKUP in shown.output  # the task name (show prints it whole)
    assert "[bold red]loud" in listing.output and ":smile:" in listing.output


def run_in_terminal(app: Any, *args: str) -> tuple[int, bytes]:
    """``celery -A tests.support.dlq_app dlq ...`` on a pseudo-terminal: exit code, raw bytes."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    proc = subprocess.Popen(
        [*CELERY_DLQ, *args],
        env={**celery_env(app), "TERM": "xterm-256color"},
        cwd=str(ROOT),
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the command exited and closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return proc.wait(timeout=60), b"".join(chunks)


def celery_env(app: Any) -> dict[str, str]:
    settings = app.jobs_settings
    return {
        **{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")},
        "JOBS_BROKER_URL": str(app.conf.broker_url),
        "JOBS_DATABASE_URL": settings.database_url,
        "PYTHONPATH": str(ROOT),
    }


def test_on_a_real_terminal_only_rich_own_colours_are_sent(
    app: Any, store: DeadLetterStore
) -> None:
    row_id = seed(store, task=EVIL, text=EVIL, traceback=EVIL)
    for args in (("list", "--task", EVIL), ("show", str(row_id))):
        code, screen = run_in_terminal(app, *args)
        assert code == 0, screen
        # rich colours with SGR sequences (ESC [ ... m); nothing else may reach the terminal.
        assert b"\x1b]" not in screen and b"\x07" not in screen and b"\x1b[2J" not in screen
        assert b"\\x1b]0;owned" in screen, screen


@pytest.mark.parametrize("option", ["--task", "--queue", "--fingerprint", "--since"])
def test_the_real_command_refuses_bytes_that_are_not_utf8(app: Any, option: str) -> None:
    # What a Latin-1 terminal or script sends: Python turns it into lone surrogates.
    done = subprocess.run(
        [*map(os.fsencode, CELERY_DLQ), b"list", option.encode() + b"=caf\xe9"],
        env=celery_env(app),
        cwd=str(ROOT),
        capture_output=True,
        timeout=60,
        check=False,
    )
    stderr = done.stderr.decode("utf-8", "replace")
    assert done.returncode == 2, stderr
    assert option in stderr and "not valid UTF-8" in stderr and "Traceback" not in stderr


# -- arguments of any shape: the dead letter is written with them as they were ---------------

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.text(STORABLE, max_size=20),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(STORABLE), inner),
    max_leaves=10,
)


def died_of(args: Any, kwargs: Any) -> DeadLetter:
    """The dead letter ``task_failure`` makes of a call that failed on these arguments."""
    task = SimpleNamespace(name="odd.args", queue_class="fast", request=None)
    exc = TypeError("odd.args() argument after * must be an iterable")
    return failure_letter(task, str(uuid.uuid4()), exc, args, kwargs, None)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ({"a": 1}, {}),  # a mapping where the list goes
        ("abc", {}),  # a string: list() would make ["a", "b", "c"]
        (5, None),  # list(5) raised and the dead letter was lost
        ((1, "x"), {"k": (2, 3)}),  # a tuple is a list
        ([1], ["not", "a", "mapping"]),
        ([1], "k=v"),
    ],
)
def test_a_letter_keeps_arguments_of_any_shape(
    app: Any, store: DeadLetterStore, args: Any, kwargs: Any
) -> None:
    row_id = store.add(died_of(args, kwargs))
    assert row_id is not None
    row = store.get(row_id)
    assert row is not None
    expected = json.loads(json.dumps([args, kwargs]))
    assert [row["args"], row["kwargs"]] == expected
    shown = run(app, "show", str(row_id))
    assert shown.exit_code == 0, shown.output
    assert f"args: {json.dumps(expected[0])}" in shown.output
    [listed_row] = [
        r
        for r in listed(run(app, "list", "--task=odd.args", "--json", "--page-size", "1000"))
        if r["id"] == row_id
    ]
    assert [listed_row["args"], listed_row["kwargs"]] == expected


@EXAMPLES
@given(args=JSON_VALUES, kwargs=JSON_VALUES)
def test_any_json_arguments_are_stored_and_shown_as_given(
    app: Any, store: DeadLetterStore, args: Any, kwargs: Any
) -> None:
    row_id = store.add(died_of(args, kwargs))
    assert row_id is not None
    row = store.get(row_id)
    assert row is not None
    assert [row["args"], row["kwargs"]] == [args, kwargs]
    shown = run(app, "show", str(row_id))
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output
