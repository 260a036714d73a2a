"""The dead-letter table on real PostgreSQL and SQLite: migrations, idempotent writes,
listing, stats, and the conditional replay / discard / purge transitions."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from jobs_platform import db
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.testing import dead_letter

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[DeadLetterStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/dlq.sqlite3"
    else:
        url = request.getfixturevalue("module_pg_url")
    db.upgrade(url)
    db.upgrade(url)  # idempotent: safe at every worker start
    store = DeadLetterStore(url)
    with store.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM dead_letter_jobs"))
    yield store


def letter(
    task: str = "billing.charge",
    *,
    reason: str = "exhausted",
    minutes_ago: float = 0,
    message: str = "partner refused #1",
    **extra: Any,
) -> DeadLetter:
    return dead_letter(
        task_name=task,
        reason=reason,
        failed_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=minutes_ago),
        **{
            "args": [1, "a"],
            "kwargs": {"k": {"nested": [1, 2]}},
            "chain": "c",
            **({} if "errors" in extra else {"message": message}),
            **extra,
        },
    )


def test_add_is_idempotent_per_chain(store: DeadLetterStore) -> None:
    first = letter()
    row_id = store.add(first)
    assert row_id is not None
    assert store.add(first) is None  # the time-limit double fire, a drainer race, ...
    assert store.count() == 1
    row = store.get(row_id)
    assert row is not None
    assert row["args"] == [1, "a"] and row["kwargs"] == {"k": {"nested": [1, 2]}}
    assert row["status"] == "dead" and row["failed_at"].tzinfo is not None
    # Same task id, a new chain (a later dispatch reusing the id): a row of its own.
    assert store.add(letter(task_id=first.task_id, chain="d")) is not None


def test_listing_is_newest_first_filtered_and_paged(store: DeadLetterStore) -> None:
    for n in range(5):
        store.add(letter("a", minutes_ago=n))
    store.add(letter("b", reason="permanent", minutes_ago=60 * 24))
    rows = store.listing(Filter(), page_size=3)
    assert [r["task_name"] for r in rows] == ["a", "a", "a"]
    assert rows[0]["failed_at"] > rows[1]["failed_at"] > rows[2]["failed_at"]
    assert len(store.listing(Filter(), page=2, page_size=3)) == 3
    assert [r["task_name"] for r in store.listing(Filter(reason="permanent"))] == ["b"]
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    assert store.count(Filter(since=since)) == 5
    assert store.count(Filter(task="b", status="dead")) == 1


def test_stats_group_by_task_and_fingerprint(store: DeadLetterStore) -> None:
    for n in range(3):
        store.add(letter("a", message=f"invoice {n} missing"))
    store.add(letter("a", message="card declined"))
    store.add(letter("b"))
    stats = store.stats(Filter(status="dead"))
    assert stats.total == 5
    assert stats.by_task == [{"task_name": "a", "count": 4}, {"task_name": "b", "count": 1}]
    top = stats.by_fingerprint[0]
    assert (top["task_name"], top["count"]) == ("a", 3)
    assert top["error_message"].startswith("invoice")


def http_letter(status: int, reason: str, invoice: int) -> DeadLetter:
    error = {
        "type": "urllib.error.HTTPError",
        "message": f"HTTP Error {status}: partner said no to invoice {invoice}",
        "at": "t",
        "attempt": 1,
        "status": status,
    }
    return letter("billing.charge", reason=reason, errors=[error])


def test_a_fingerprint_selects_one_cause_for_bulk_operations(store: DeadLetterStore) -> None:
    # One task, one wording once numbers are normalised away: a 503 that ran out of retries
    # and a 404 that failed at once are different causes, and a bulk replay by fingerprint
    # must pick only one of them.
    unavailable = [store.add(http_letter(503, "exhausted", n)) for n in (1, 2)]
    not_found = store.add(http_letter(404, "permanent", 3))
    first, other = store.get(unavailable[0] or 0), store.get(not_found or 0)
    assert first is not None and other is not None
    fp = first["fingerprint"]
    assert [i for batch in store.ids(Filter(fingerprint=fp)) for i in batch] == unavailable
    assert other["fingerprint"] != fp
    assert (first["errors"][-1]["status"], other["errors"][-1]["status"]) == (503, 404)
    groups = store.stats(Filter(task="billing.charge")).by_fingerprint
    assert sorted(g["count"] for g in groups) == [1, 2]

    # A row stored before the basis changed keeps its fingerprint: nothing recomputes it.
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE dead_letter_jobs SET fingerprint = 'legacy0000000000' WHERE id = :i"),
            {"i": not_found},
        )
    assert store.count(Filter(fingerprint="legacy0000000000")) == 1


def test_replay_moves_the_row_once_and_rolls_back_when_publishing_fails(
    store: DeadLetterStore,
) -> None:
    row_id = store.add(letter())
    assert row_id is not None

    def broken(row: dict[str, Any], new_task_id: str) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        store.replay(row_id, reason="fixed", actor="ann", publish=broken)
    assert store.get(row_id)["status"] == "dead"  # type: ignore[index]

    published: list[str] = []
    new_id = store.replay(
        row_id, reason="fixed", actor="ann", publish=lambda row, tid: published.append(tid)
    )
    assert new_id is not None and published == [new_id]
    again = store.replay(
        row_id, reason="fixed", actor="ann", publish=lambda row, tid: published.append(tid)
    )
    assert again is None and published == [new_id]  # the second replay enqueues nothing
    row = store.get(row_id)
    assert row is not None
    assert (row["status"], row["replayed_task_id"], row["resolved_by"]) == (
        "replayed",
        new_id,
        "ann",
    )
    assert row["resolution_reason"] == "fixed" and row["resolved_at"] is not None


def test_discard_and_purge(store: DeadLetterStore) -> None:
    old = store.add(letter(minutes_ago=60 * 24 * 40))
    new = store.add(letter())
    dead_old = store.add(letter(minutes_ago=60 * 24 * 40))
    assert old and new and dead_old
    assert store.discard([old, new], reason="duplicate", actor="ann") == 2
    assert store.discard([old], reason="again", actor="ann") == 0  # only dead rows move
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    assert store.purge(cutoff, statuses=("replayed", "discarded")) == 1
    assert store.get(old) is None
    assert store.get(new) is not None and store.get(dead_old) is not None


def test_lineage_link_survives_purge_of_the_parent(store: DeadLetterStore) -> None:
    parent = store.add(letter(minutes_ago=60 * 24 * 40))
    assert parent is not None
    child = store.add(letter(replay_of=parent))
    assert child is not None
    store.discard([parent], reason="replayed by hand", actor="ann")
    store.purge(dt.datetime.now(dt.UTC) - dt.timedelta(days=30), statuses=("discarded",))
    row = store.get(child)
    assert row is not None and row["replay_of"] is None


def test_ids_batches_cover_the_filter(store: DeadLetterStore) -> None:
    ids = {store.add(letter("a")) for _ in range(7)}
    store.add(letter("b"))
    batches = list(store.ids(Filter(task="a"), batch=3))
    assert [len(b) for b in batches] == [3, 3, 1]
    assert {i for b in batches for i in b} == ids


def test_a_replay_whose_parent_was_purged_is_stored_without_the_link(
    store: DeadLetterStore,
) -> None:
    # The FK would refuse the row (and, before, block the spool behind it forever).
    child = store.add(letter(replay_of=2_000_000_000))
    assert child is not None
    row = store.get(child)
    assert row is not None and row["replay_of"] is None
    parent = store.add(letter())
    linked = store.add(letter(replay_of=parent))
    assert linked is not None and store.get(linked)["replay_of"] == parent  # type: ignore[index]
