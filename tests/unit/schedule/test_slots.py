"""Slot arithmetic (pure): the times a run is for, the same whoever computes them."""

from __future__ import annotations

import datetime as dt

import pytest
from celery.schedules import crontab, schedule

from jobs_platform.errors import ConfigError
from jobs_platform.schedule.slots import (
    MAX_SCAN,
    MIN_SLOT_TTL_S,
    due_slots,
    next_slot,
    parse_slot,
    slot_iso,
    slot_key,
    slot_ttl_s,
)
from jobs_platform.testing import FakeClock

T0 = dt.datetime(2026, 1, 1, 1, 59, 30, tzinfo=dt.UTC)


def at(hour: int, minute: int = 0, second: int = 0, day: int = 1) -> dt.datetime:
    return dt.datetime(2026, 1, day, hour, minute, second, tzinfo=dt.UTC)


def test_slot_key_names_entry_and_slot_time_not_now() -> None:
    slot = at(2)
    assert slot_key("nightly-report", slot) == (
        "jobs:beat:slot:nightly-report:2026-01-01T02:00:00.000+00:00"
    )
    assert parse_slot(slot_iso(slot)) == slot


def test_a_naive_slot_is_utc_so_two_processes_agree_on_the_key() -> None:
    assert slot_key("e", at(2).replace(tzinfo=None)) == slot_key("e", at(2))


def test_interval_slots_are_multiples_of_the_interval_since_the_epoch() -> None:
    every_10_min = schedule(dt.timedelta(minutes=10))
    assert next_slot(every_10_min, at(1, 59, 30)) == at(2)
    assert next_slot(every_10_min, at(2)) == at(2, 10)  # strictly after
    # Two beats asking at different moments of the same period get the same slot.
    clock = FakeClock(at(2, 0, 1))
    first = next_slot(every_10_min, clock.now())
    clock.advance(300)
    assert next_slot(every_10_min, clock.now()) == first == at(2, 10)


def test_a_number_of_seconds_is_an_interval_too() -> None:
    from celery.schedules import maybe_schedule

    assert next_slot(maybe_schedule(7), dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC)) == (
        dt.datetime(1970, 1, 1, 0, 0, 7, tzinfo=dt.UTC)
    )


def test_crontab_slots_are_the_times_it_names() -> None:
    nightly = crontab(minute=0, hour=2)
    assert next_slot(nightly, T0) == at(2)
    assert next_slot(nightly, at(2)) == at(2, day=2)
    assert next_slot(crontab(minute="*/15"), at(2, 14, 59)) == at(2, 15)


def test_crontab_slots_do_not_depend_on_the_wall_clock() -> None:
    # Celery's schedules read "now"; the slot after a given time must not.
    nightly = crontab(minute=0, hour=2, nowfun=lambda: at(23, 59, day=9))
    assert next_slot(nightly, T0) == at(2)


def test_due_interval_slots_newest_first_kept_and_counted() -> None:
    every_s = schedule(dt.timedelta(seconds=1))
    due = due_slots(
        every_s,
        at(2),
        at(
            2,
            0,
            10,
        ),
        keep=2,
    )
    assert due.count == 10
    assert due.newest == (at(2, 0, 9), at(2, 0, 10))
    assert due.exact


def test_nothing_is_due_at_or_before_the_last_decided_slot() -> None:
    every_s = schedule(dt.timedelta(seconds=1))
    assert due_slots(every_s, at(2), at(2), keep=1).count == 0
    assert (
        due_slots(every_s, at(2), at(2, 0, 0) + dt.timedelta(milliseconds=999), keep=1).count == 0
    )
    assert due_slots(every_s, at(2), at(2, 0, 1), keep=1).newest == (at(2, 0, 1),)


def test_due_crontab_slots_after_a_day_down() -> None:
    hourly = crontab(minute=0)
    due = due_slots(hourly, at(1, 30), at(1, 30, day=2), keep=2)
    assert due.count == 24
    assert due.newest == (at(0, day=2), at(1, day=2))


def test_a_minutely_crontab_down_for_weeks_finds_its_newest_slots_without_a_full_scan() -> None:
    minutely = crontab()
    now = at(12, 30, 10, day=20)
    due = due_slots(minutely, at(0), now, keep=3)
    assert due.newest == (at(12, 28, day=20), at(12, 29, day=20), at(12, 30, day=20))
    assert not due.exact and due.count >= MAX_SCAN


def test_keep_must_be_positive() -> None:
    with pytest.raises(ValueError):
        due_slots(crontab(), at(0), at(1), keep=0)


def test_a_zero_interval_is_refused() -> None:
    with pytest.raises(ConfigError, match="> 0"):
        next_slot(schedule(dt.timedelta(0)), at(0))


def test_slot_records_outlive_three_periods_and_at_least_ten_minutes() -> None:
    assert slot_ttl_s(schedule(dt.timedelta(seconds=1)), at(2)) == MIN_SLOT_TTL_S
    assert slot_ttl_s(crontab(minute=0, hour=2), at(2)) == 3 * 86400 + 1
