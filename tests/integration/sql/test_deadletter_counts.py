"""dead_letter_counts on real PostgreSQL and SQLite: the triggers keep the group counts
``dlq stats`` reads equal to a GROUP BY over the rows, whoever writes and however."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from jobs_platform import db
from jobs_platform.deadletter.model import GROUP
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.testing import dead_letter
from tests.conftest import fresh_pg_database

pytestmark = pytest.mark.integration

COLUMNS = ", ".join(GROUP)


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A new, empty database for each test (migrations are part of what is tested)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/counts.sqlite3"
        return
    with fresh_pg_database() as pg:
        yield pg
        db.engine_for(pg).dispose()


def letter(
    task: str, message: str, *, reason: str = "exhausted", queue: str = "fast"
) -> DeadLetter:
    return dead_letter(
        task_name=task,
        reason=reason,
        queue=queue,
        message=message,
        chain=uuid.uuid4().hex,
        failed_at=dt.datetime.now(dt.UTC),
    )


def counted(url: str) -> dict[tuple[str, ...], tuple[int, int | None]]:
    with db.engine_for(url).connect() as conn:
        rows = conn.execute(sa.text(f"SELECT {COLUMNS}, count, last_id FROM dead_letter_counts"))
        return {tuple(r[:5]): (int(r[5]), r[6]) for r in rows}


def from_rows(url: str) -> dict[tuple[str, ...], tuple[int, int | None]]:
    with db.engine_for(url).connect() as conn:
        rows = conn.execute(
            sa.text(f"SELECT {COLUMNS}, count(*), max(id) FROM dead_letter_jobs GROUP BY {COLUMNS}")
        )
        return {tuple(r[:5]): (int(r[5]), r[6]) for r in rows}


def assert_exact(url: str) -> None:
    """The counts equal the rows' GROUP BY, newest row included, and stats agree by every
    filter they serve."""
    assert counted(url) == from_rows(url)
    store = DeadLetterStore(url)
    filters = [Filter()] + [
        Filter(status=s, task=t, reason=r)
        for s, t, r in itertools.product(
            (None, "dead", "replayed", "discarded"), (None, "a", "b"), (None, "exhausted", "poison")
        )
    ]
    for where in filters:
        assert store.stats(where) == store.stats(where, exact=True), where


def test_every_write_through_the_store_is_counted(url: str) -> None:
    db.upgrade(url)
    store = DeadLetterStore(url)
    ids = [store.add(letter("a", f"invoice {n} missing")) for n in range(6)]
    ids += [store.add(letter("a", "card declined", reason="poison", queue="heavy"))]
    ids += [store.add(letter("b", "timeout")) for _ in range(3)]
    assert store.add(letter("b", "timeout")) is not None
    assert all(ids)
    assert_exact(url)

    store.replay(ids[5] or 0, reason="fixed", actor="ann", publish=lambda row, tid: None)
    assert_exact(url)
    # The dead group's newest row was replayed: its sample is now the next newest.
    fp = (store.get(ids[0] or 0) or {})["fingerprint"]
    group = counted(url)[("dead", "a", "fast", "exhausted", fp)]
    assert group == (5, ids[4])
    assert store.discard([i for i in ids[:3] if i], reason="dup", actor="ann") == 3
    assert_exact(url)
    stats = store.stats(Filter(status="dead"))
    assert stats.by_status == {"dead": 7} and stats.total == 7
    assert {t["task_name"]: t["count"] for t in stats.by_task} == {"a": 3, "b": 4}

    old = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    assert store.purge(old, statuses=("replayed", "discarded")) == 4
    assert_exact(url)
    assert store.stats().by_status == {"dead": 7}


def raw_row(
    task: str, status: str = "dead", fingerprint: str = "f0000000000000ff"
) -> dict[str, Any]:
    """A row as another writer would insert it: no platform code on the way."""
    return {
        "dedupe_key": uuid.uuid4().hex,
        "task_name": task,
        "queue": "fast",
        "reason": "exhausted",
        "fingerprint": fingerprint,
        "status": status,
        "redacted": False,
        "attempts": 1,
        "errors": "[]",
        "error_type": "E",
        "error_message": "m",
        "failed_at": dt.datetime.now(dt.UTC),
    }


INSERT = sa.text(
    "INSERT INTO dead_letter_jobs (dedupe_key, task_name, queue, reason, fingerprint, status,"
    " redacted, attempts, errors, error_type, error_message, failed_at) VALUES (:dedupe_key,"
    " :task_name, :queue, :reason, :fingerprint, :status, :redacted, :attempts, :errors,"
    " :error_type, :error_message, :failed_at)"
)


def test_writers_that_bypass_the_store_are_counted(url: str) -> None:
    """A worker of the previous release (no counting code), a fix by hand in SQL, a bulk
    statement over many groups: the database counts them all."""
    db.upgrade(url)
    engine = db.engine_for(url)
    with engine.begin() as conn:
        conn.execute(INSERT, [raw_row("a") for _ in range(5)] + [raw_row("b") for _ in range(4)])
        conn.execute(INSERT, [raw_row("a", fingerprint="f0000000000000aa")])
    assert_exact(url)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE dead_letter_jobs SET status = 'discarded' WHERE task_name = 'b'")
        )
        conn.execute(
            sa.text("UPDATE dead_letter_jobs SET fingerprint = 'legacy0000000000' WHERE id = 1")
        )
        conn.execute(
            sa.text("UPDATE dead_letter_jobs SET error_message = 'edited'")
        )  # no group change
    assert_exact(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM dead_letter_jobs WHERE task_name = 'a' AND id > 3"))
    assert_exact(url)
    with engine.begin() as conn:  # a rolled-back write leaves the counts as they were
        conn.execute(INSERT, [raw_row("c")])
        conn.rollback()
    assert_exact(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM dead_letter_jobs"))
    assert counted(url) == {}
    if url.startswith("postgresql"):
        with engine.begin() as conn:
            conn.execute(INSERT, [raw_row("a")])
            conn.execute(sa.text("TRUNCATE dead_letter_jobs CASCADE"))
        assert counted(url) == {}


def test_concurrent_writers_of_the_same_groups_count_exactly(url: str) -> None:
    """Eight writers add to and discard from the same two groups at once."""
    db.upgrade(url)
    store = DeadLetterStore(url)

    def work(n: int) -> None:
        mine = [store.add(letter("a" if i % 2 else "b", "same cause")) for i in range(20)]
        store.discard([i for i in mine[:6] if i], reason="dup", actor=f"w{n}")
        for row_id in mine[6:8]:
            store.replay(row_id or 0, reason="fixed", actor=f"w{n}", publish=lambda row, tid: None)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert_exact(url)
    assert store.stats().by_status == {"dead": 96, "discarded": 48, "replayed": 16}


def test_the_migration_counts_the_rows_already_there_and_goes_back(url: str) -> None:
    db.upgrade(url, "0002")
    with db.engine_for(url).begin() as conn:
        conn.execute(INSERT, [raw_row("a") for _ in range(3)] + [raw_row("b", "replayed")])
    db.upgrade(url)
    assert counted(url) == {
        ("dead", "a", "fast", "exhausted", "f0000000000000ff"): (3, 3),
        ("replayed", "b", "fast", "exhausted", "f0000000000000ff"): (1, 4),
    }
    assert_exact(url)

    command.downgrade(db.alembic_config(url), "0002")
    with db.engine_for(url).connect() as conn:
        inspector = sa.inspect(conn)
        assert not inspector.has_table("dead_letter_counts")
        indexes = {i["name"] for i in inspector.get_indexes("dead_letter_jobs")}
        assert "ix_dead_letter_jobs_status_task_name_fingerprint" in indexes
    with db.engine_for(url).begin() as conn:  # no trigger left behind to fail a write
        conn.execute(INSERT, [raw_row("a")])
    db.upgrade(url)
    assert_exact(url)


def test_recount_rebuilds_counts_damaged_by_hand(url: str) -> None:
    db.upgrade(url)
    store = DeadLetterStore(url)
    for n in range(4):
        store.add(letter("a", f"cause {n % 2}"))
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE dead_letter_counts SET count = 99"))
        conn.execute(
            sa.text(
                f"INSERT INTO dead_letter_counts ({COLUMNS}, count)"
                " VALUES ('dead', 'x', 'q', 'exhausted', 'f', 5)"
            )
        )
    assert counted(url) != from_rows(url)
    assert store.recount() == len(from_rows(url))
    assert_exact(url)
