"""The flow scripts on the real Redis: slots, the wait list and its generations, the keeper
extending slots, and debounce windows (jobs_platform/flow)."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from jobs_platform.coordination.lease import Leases
from jobs_platform.flow.concurrency import Keeper, Slots, Taken, gen_key, slot_prefix
from jobs_platform.flow.debounce import Windows, released_key, window_key
from jobs_platform.testing import wait_for

pytestmark = pytest.mark.integration


def take(
    slots: Slots, key: str, owner: str, gen: str | None = None, limit: int = 1, new: str = "g"
) -> Taken:
    return slots.take(
        key,
        limit,
        owner=owner,
        generation=gen,
        new_generation=new,
        record=f"record-of-{owner}",
        ttl_s=15.0,
        fallback_max_s=15.0,
    )


def test_a_full_key_queues_waiters_and_a_release_hands_on_the_oldest(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    slots, key = Slots(client), f"acct-{uuid.uuid4().hex[:6]}"
    first = take(slots, key, "job-1", limit=2)
    second = take(slots, key, "job-2", limit=2)
    assert first.slot and second.slot and first.slot != second.slot
    third, fourth = take(slots, key, "job-3", limit=2), take(slots, key, "job-4", limit=2)
    assert third.slot is None and 14.0 < third.wait_s <= 15.25  # until the soonest runs out
    assert fourth.slot is None and slots.waiting(key) == 2
    assert slots.release(key, first.slot, "job-1") == "record-of-job-3"  # oldest first
    assert client.get(first.slot) is None
    assert slots.release(key, second.slot, "job-2") == "record-of-job-4"
    assert slots.release(key, second.slot, "job-2") is None  # nobody waits


def test_the_first_copy_of_a_wait_claims_it_and_the_other_is_dropped(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    slots, key = Slots(client), f"acct-{uuid.uuid4().hex[:6]}"
    holder = take(slots, key, "holder")
    assert take(slots, key, "waiter", new="g1").slot is None  # waits: g1 is current
    assert client.get(gen_key("waiter")) == b"g1"
    # Still full: the woken copy (g1) waits again, as g2.
    assert take(slots, key, "waiter", gen="g1", new="g2").slot is None
    assert take(slots, key, "waiter", gen="g1", new="g3").stale  # the fallback copy of g1
    # A delivery without a generation (a retry after a lost attempt) starts a new one...
    assert take(slots, key, "waiter", new="g4").slot is None
    assert take(slots, key, "waiter", gen="g2", new="g5").stale  # ...and g2's copies go
    assert holder.slot is not None
    slots.release(key, holder.slot, "holder")
    won = take(slots, key, "waiter", gen="g4", new="g6")
    assert won.slot is not None and client.get(gen_key("waiter")) is None
    assert take(slots, key, "waiter", gen="g4", new="g7").stale  # the other copy of g4
    assert slots.waiting(key) == 0


def test_a_job_takes_back_its_own_slot_after_a_lost_attempt(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    slots, key = Slots(client), f"acct-{uuid.uuid4().hex[:6]}"
    mine = take(slots, key, "job-1")
    again = take(slots, key, "job-1")  # its retry, while its old lease still holds
    assert again.slot == mine.slot == f"{slot_prefix(key)}1"


def test_the_keeper_extends_held_slots_and_stops_when_dropped(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    slots, key = Slots(client), f"acct-{uuid.uuid4().hex[:6]}"
    taken = slots.take(
        key,
        1,
        owner="job-1",
        generation=None,
        new_generation="g",
        record="r",
        ttl_s=0.6,
        fallback_max_s=1.0,
    )
    assert taken.slot is not None
    keeper = Keeper(Leases(client), 0.6)
    keeper.hold(taken.slot, "job-1")
    started = time.monotonic()
    try:
        # Held past three of its TTLs: only the keeper's extensions can keep it.
        wait_for(
            lambda: time.monotonic() - started > 1.8 and client.get(taken.slot) == b"job-1",
            timeout_s=10,
            message="the keeper to keep the slot",
        )
        keeper.drop(taken.slot)
        wait_for(lambda: client.get(taken.slot) is None, timeout_s=5, message="it to run out")
    finally:
        keeper.close()


def test_a_debounce_window_keeps_the_first_id_and_the_last_arguments(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    windows, key = Windows(client), f"doc-{uuid.uuid4().hex[:6]}"
    opened = windows.dispatch(
        "t.reindex", key, new_id="run-1", arguments="[[1],{}]", window_s=5, max_s=50
    )
    assert opened.opened and opened.id == "run-1"
    later = windows.dispatch(
        "t.reindex", key, new_id="run-2", arguments="[[2],{}]", window_s=5, max_s=50
    )
    assert not later.opened and later.id == "run-1" and 4.0 < later.due_in_s <= 5.0
    early = windows.claim("t.reindex", key, "run-1")
    assert early.arguments is None and 4.0 < early.wait_s <= 5.0  # not quiet yet
    client.hset(window_key("t.reindex", key), "due", 0)  # as if the window had passed
    claim = windows.claim("t.reindex", key, "run-1")
    assert claim.arguments == "[[2],{}]"
    # A trigger redelivered before the run was published publishes it again...
    assert windows.claim("t.reindex", key, "run-1").arguments == "[[2],{}]"
    windows.published("run-1")
    # ...and once it is, the trigger has nothing to do; the next dispatch opens a new window.
    assert windows.claim("t.reindex", key, "run-1").done
    assert not client.exists(released_key("run-1"))
    nxt = windows.dispatch(
        "t.reindex", key, new_id="run-3", arguments="[[3],{}]", window_s=5, max_s=50
    )
    assert nxt.opened and nxt.id == "run-3"


def test_a_steady_stream_is_due_at_the_maximum(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    windows, key = Windows(client), f"doc-{uuid.uuid4().hex[:6]}"
    windows.dispatch("t.reindex", key, new_id="run-1", arguments="[[],{}]", window_s=5, max_s=6)
    client.hset(window_key("t.reindex", key), "first", int(client.time()[0]) * 1000 - 5500)
    later = windows.dispatch(
        "t.reindex", key, new_id="run-2", arguments="[[],{}]", window_s=5, max_s=6
    )
    assert later.due_in_s <= 0.5  # capped at first + max, not pushed 5 s out
