"""Overlap and catch-up policies (pure): which due slots beat sends."""

from __future__ import annotations

import datetime as dt

import pytest

from jobs_platform.errors import ConfigError
from jobs_platform.schedule.policies import (
    DEFAULT_CATCH_UP,
    DEFAULT_OVERLAP,
    MAX_CATCH_UP,
    EntryPolicy,
    plan,
    split_options,
)
from jobs_platform.testing import FakeClock

START = dt.datetime(2026, 1, 1, 2, 0, tzinfo=dt.UTC)


def slots(first: int, last: int, period_s: float = 1.0) -> list[dt.datetime]:
    return [START + dt.timedelta(seconds=k * period_s) for k in range(first, last + 1)]


def test_defaults_skip_overlaps_and_catch_up_once() -> None:
    policy, rest = split_options("e", {"queue": "heavy", "priority": 3})
    assert policy == EntryPolicy()
    assert (DEFAULT_OVERLAP, DEFAULT_CATCH_UP) == ("skip", 1)
    assert rest == {"queue": "heavy", "priority": 3}  # Celery's options pass through


def test_policy_keys_are_taken_out_of_the_options() -> None:
    policy, rest = split_options("e", {"overlap": "allow", "catch_up": 3, "grace": 5, "queue": "x"})
    assert policy == EntryPolicy("allow", 3, 5.0)
    assert rest == {"queue": "x"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap": "queue"}, "overlap must be one of"),
        ({"catch_up": -1}, "between 0 and"),
        ({"catch_up": MAX_CATCH_UP + 1}, "between 0 and"),
        ({"catch_up": 1.5}, "must be an int"),
        ({"catch_up": True}, "must be an int"),
        ({"catch_up": None}, "must be an int"),
        ({"grace": -1}, "grace"),
        ({"grace": float("inf")}, "grace"),
        ({"grace": "60"}, "grace"),
    ],
)
def test_bad_policies_are_refused_naming_the_entry(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        split_options("nightly-report", options)
    assert "'nightly-report'" in str(caught.value)


def test_a_slot_reached_on_time_is_sent() -> None:
    clock = FakeClock(START + dt.timedelta(milliseconds=20))
    assert plan(slots(0, 0), 1, clock.now(), EntryPolicy()).send == tuple(slots(0, 0))


def test_after_downtime_at_most_one_missed_slot_is_sent_by_default() -> None:
    # Beat was down for 10 intervals: slots 1..10 are due at 10.3 s; 10 is on time.
    now = START + dt.timedelta(seconds=10.3)
    decided = plan(slots(9, 10), 10, now, EntryPolicy())
    assert decided.send == tuple(slots(9, 10))
    assert decided.missed == 8


@pytest.mark.parametrize("catch_up", [0, 1, 3, 20])
def test_catch_up_n_sends_at_most_n_missed_slots_newest_first_kept(catch_up: int) -> None:
    now = START + dt.timedelta(seconds=10.3)
    newest = slots(max(1, 10 - catch_up), 10)  # what due_slots gives: catch_up + 1 at most
    decided = plan(newest, 10, now, EntryPolicy(catch_up=catch_up))
    late = decided.send[:-1]
    assert len(late) == min(catch_up, 9)
    assert decided.send[-1] == slots(10, 10)[0]  # the on-time slot always goes
    assert list(decided.send) == sorted(decided.send)  # oldest first
    assert decided.missed == 10 - len(decided.send)


def test_a_slot_later_than_grace_is_missed_not_on_time() -> None:
    nightly = [START]
    seven_hours_late = START + dt.timedelta(hours=7)
    assert plan(nightly, 1, seven_hours_late, EntryPolicy(catch_up=0)).send == ()
    assert plan(nightly, 1, seven_hours_late, EntryPolicy(catch_up=1)).send == (START,)
    within_grace = START + dt.timedelta(seconds=30)
    assert plan(nightly, 1, within_grace, EntryPolicy(catch_up=0)).send == (START,)


def test_nothing_due_sends_nothing() -> None:
    assert plan([], 0, START, EntryPolicy()).send == ()


def test_a_count_below_the_slots_given_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        plan(slots(0, 2), 1, START, EntryPolicy())
