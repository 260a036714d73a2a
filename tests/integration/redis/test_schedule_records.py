"""The beat's Redis records on the real Redis: slot records (SET NX), overlap markers, the
leader lock, shared progress."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from jobs_platform.schedule.leader import LeaderLock
from jobs_platform.schedule.running import RunningMarkers, running_key
from jobs_platform.schedule.slots import SlotRecords, slot_key
from jobs_platform.schedule.state import BeatState
from jobs_platform.testing import wait_for

pytestmark = pytest.mark.integration

SLOT = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.UTC)


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.close()


def entry() -> str:
    return f"e-{uuid.uuid4().hex[:8]}"


def test_a_slot_is_recorded_once_whoever_asks(client: redis.Redis) -> None:
    records, name = SlotRecords(client), entry()
    assert records.claim(name, SLOT, "beat-a", ttl_s=600)
    assert not records.claim(name, SLOT, "beat-b", ttl_s=600)
    assert not records.claim(name, SLOT, "beat-a", ttl_s=600)  # not even twice by one beat
    assert records.holder(name, SLOT) == "beat-a"
    assert 590 < client.ttl(slot_key(name, SLOT)) <= 600
    # Another slot of the same entry, or the same slot of another entry, is its own record.
    assert records.claim(name, SLOT + dt.timedelta(seconds=1), "beat-b", ttl_s=600)
    assert records.claim(entry(), SLOT, "beat-b", ttl_s=600)


def test_only_the_recording_sender_can_undo_a_slot(client: redis.Redis) -> None:
    records, name = SlotRecords(client), entry()
    records.claim(name, SLOT, "beat-a", ttl_s=600)
    assert not records.release(name, SLOT, "beat-b")
    assert records.holder(name, SLOT) == "beat-a"
    assert records.release(name, SLOT, "beat-a")
    assert records.claim(name, SLOT, "beat-b", ttl_s=600)  # sendable again


def test_concurrent_claims_of_one_slot_have_one_winner(client: redis.Redis, redis_url: str) -> None:
    import threading

    name, wins = entry(), []
    start = threading.Barrier(8)

    def contend(sender: str) -> None:
        records = SlotRecords(redis.Redis.from_url(redis_url))
        start.wait()
        if records.claim(name, SLOT, sender, ttl_s=600):
            wins.append(sender)

    threads = [threading.Thread(target=contend, args=(f"b{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(wins) == 1


def test_an_overlap_marker_has_one_holder_until_it_releases(client: redis.Redis) -> None:
    markers, name = RunningMarkers(client), entry()
    assert markers.acquire(name, "run-1", ttl_s=60) == "run-1"
    assert markers.acquire(name, "run-2", ttl_s=60) == "run-1"  # the next slot sees run-1
    assert markers.entry_of_run("run-1") == name
    assert not markers.release(name, "run-2")  # only run-1 may clear it
    assert not markers.refresh(name, "run-2", 600)
    assert markers.refresh(name, "run-1", 600)
    assert 590_000 < client.pttl(running_key(name)) <= 600_000
    assert markers.release(name, "run-1")
    assert markers.holder(name) is None and markers.entry_of_run("run-1") is None
    assert markers.acquire(name, "run-2", ttl_s=60) == "run-2"


def test_a_marker_frees_itself_after_its_ttl(client: redis.Redis) -> None:
    markers, name = RunningMarkers(client), entry()
    markers.acquire(name, "killed-run", ttl_s=0.2)
    wait_for(lambda: markers.holder(name) is None, timeout_s=5, message="marker expiry")
    assert markers.acquire(name, "next-run", ttl_s=60) == "next-run"


def test_one_leader_at_a_time_and_a_clean_handover(client: redis.Redis) -> None:
    app = f"app-{uuid.uuid4().hex[:6]}"
    a, b = LeaderLock(client, app, "a", 5), LeaderLock(client, app, "b", 5)
    assert a.hold() and a.hold()  # taken, then extended
    assert not b.hold()
    assert b.current() == "a"
    assert not b.release()  # not b's to release
    assert a.release()
    assert b.hold() and not a.hold()


def test_a_dead_leaders_lock_expires_and_the_standby_takes_over(client: redis.Redis) -> None:
    app = f"app-{uuid.uuid4().hex[:6]}"
    a, b = LeaderLock(client, app, "a", 0.5), LeaderLock(client, app, "b", 0.5)
    assert a.hold()
    started = time.monotonic()
    wait_for(b.hold, timeout_s=5, interval_s=0.02, message="standby takes the lock")
    assert 0.3 < time.monotonic() - started < 1.5
    assert not a.hold()  # a resumes: it is standby now


def test_progress_only_moves_forward(client: redis.Redis) -> None:
    state, name = BeatState(client), entry()
    assert state.done_up_to([name]) == {name: None}
    assert state.advance(name, SLOT + dt.timedelta(seconds=2))
    assert not state.advance(name, SLOT)  # a paused old leader cannot take it back
    assert state.done_up_to([name]) == {name: SLOT + dt.timedelta(seconds=2)}


def test_ticks_and_skip_counts_are_kept_for_exporters(client: redis.Redis) -> None:
    state, kept, gone = BeatState(client), entry(), entry()
    state.record_ticks([kept, gone], SLOT)
    assert state.ticks()[kept] == "2026-01-01T02:00:00.000+00:00"
    assert state.forget_ticks([kept]) >= 1
    assert gone not in state.ticks() and kept in state.ticks()
    state.count_skip(kept, "overlap")
    state.count_skip(kept, "missed", 7)
    assert (state.skipped(kept, "overlap"), state.skipped(kept, "missed")) == (1, 7)
