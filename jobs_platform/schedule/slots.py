"""Slots: the scheduled times of an entry, and the per-slot record that sends each once.

A *slot* is the time a run is scheduled for (02:00:00 for a nightly crontab), not the time
beat happened to send it. Two beats, or a leader and the standby that replaces it, compute
the same slots from the schedule alone, so ``jobs:beat:slot:<entry>:<slot>`` names the same
run for all of them; whoever ``SET ... NX``\\ s it first sends it, the others do not.

Slots of each schedule type (the arithmetic is pure):

* ``crontab`` and ``solar``: the times the schedule names (Celery computes the next one).
* intervals (a ``timedelta`` or a number of seconds): multiples of the interval since the
  Unix epoch, UTC, so ``timedelta(minutes=10)`` fires at :00, :10, :20... Celery counts an
  interval from the previous run instead, which drifts and differs between two beats.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
from typing import Any

import redis
from celery.schedules import schedule as interval_schedule

from jobs_platform.clock import as_utc, utc_iso
from jobs_platform.coordination.lease import Leases
from jobs_platform.errors import ConfigError

KEY_PREFIX = "jobs:beat:"
SLOT_PREFIX = KEY_PREFIX + "slot:"
#: Message headers of a scheduled run: the entry's name and the slot's ISO time.
ENTRY_HEADER = "jobs_beat_entry"
SLOT_HEADER = "jobs_beat_slot"
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: A slot record outlives any beat that could still be deciding that slot (two beats
#: racing, a paused leader resuming): at least this long, and three periods.
MIN_SLOT_TTL_S = 600
#: Slots enumerated one by one before switching to a search back from now (a minutely
#: crontab down for a week is 10,080 slots).
MAX_SCAN = 10_000

#: Prefix of a record whose slot was decided but not sent (``skipped:overlap:<sender>``).
SKIPPED_MARK = "skipped:"


def slot_iso(slot: dt.datetime) -> str:
    return utc_iso(slot)


def parse_slot(text: str) -> dt.datetime:
    return as_utc(dt.datetime.fromisoformat(text))


def slot_key(entry: str, slot: dt.datetime) -> str:
    """``jobs:beat:slot:<entry>:<slot ISO time>``."""
    return f"{SLOT_PREFIX}{entry}:{slot_iso(slot)}"


def interval_of(sched: Any) -> dt.timedelta | None:
    """The period of an interval schedule; ``None`` for crontab, solar and others."""
    if not isinstance(sched, interval_schedule):
        return None
    period: dt.timedelta = sched.run_every
    if period <= dt.timedelta(0):
        raise ConfigError(f"an interval schedule must be > 0 seconds, got {period}")
    return period


def next_slot(sched: Any, after: dt.datetime) -> dt.datetime:
    """The first slot strictly after ``after``."""
    after = as_utc(after)
    period = interval_of(sched)
    if period is not None:
        return EPOCH + ((after - EPOCH) // period + 1) * period
    # Celery's schedules answer "how long from now until the run after last_run_at":
    # asked with now == after, that is exactly the next slot (no clock read in between).
    frozen = copy.copy(sched)
    frozen.nowfun = lambda: after
    following = as_utc(after + frozen.remaining_estimate(after))
    if following <= after:
        raise ConfigError(f"schedule {sched!r} names no time after {after.isoformat()}")
    return following


@dataclasses.dataclass(frozen=True)
class DueSlots:
    """The slots in ``(after, now]``: the newest few, and how many there are."""

    newest: tuple[dt.datetime, ...]
    count: int
    #: False when there were so many that ``count`` is only a lower bound.
    exact: bool = True


def due_slots(sched: Any, after: dt.datetime, now: dt.datetime, *, keep: int) -> DueSlots:
    """The newest ``keep`` slots in ``(after, now]`` (oldest first) and their total."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    after, now = as_utc(after), as_utc(now)
    if now <= after:
        return DueSlots((), 0)
    period = interval_of(sched)
    if period is not None:
        first, last = (after - EPOCH) // period + 1, (now - EPOCH) // period
        count = max(0, last - first + 1)
        newest = range(max(first, last - keep + 1), last + 1)
        return DueSlots(tuple(EPOCH + k * period for k in newest), count)
    scanned = _scan(sched, after, now, MAX_SCAN)
    if len(scanned) < MAX_SCAN:
        return DueSlots(tuple(scanned[-keep:]), len(scanned))
    # Down for very long: look back from now, widening, for the newest ones.
    width = (scanned[-1] - scanned[0]) / (len(scanned) - 1) * (keep + 1)
    while True:
        since = max(now - width, scanned[-1])
        found = _scan(sched, since, now, MAX_SCAN)
        if len(found) >= keep or since == scanned[-1]:
            return DueSlots(tuple(found[-keep:]), MAX_SCAN + len(found), exact=False)
        width *= 2


def _scan(sched: Any, after: dt.datetime, until: dt.datetime, limit: int) -> list[dt.datetime]:
    found: list[dt.datetime] = []
    moment = after
    while len(found) < limit:
        moment = next_slot(sched, moment)
        if moment > until:
            break
        found.append(moment)
    return found


def slot_ttl_s(sched: Any, slot: dt.datetime) -> int:
    """How long the record of ``slot`` is kept: three periods, at least MIN_SLOT_TTL_S."""
    period = (next_slot(sched, slot) - slot).total_seconds()
    return max(MIN_SLOT_TTL_S, int(3 * period) + 1)


class SlotRecords:
    """``jobs:beat:slot:*`` on one Redis: who sent (or decided) each slot. Each record is a
    lease of the sender (:mod:`jobs_platform.coordination.lease`)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._leases = Leases(client)

    def claim(self, entry: str, slot: dt.datetime, sender: str, ttl_s: int) -> bool:
        """Record ``sender`` as the one sending ``slot``; False if someone already did."""
        _holder, acquired = self._leases.acquire(slot_key(entry, slot), sender, ttl_s)
        return acquired

    def release(self, entry: str, slot: dt.datetime, sender: str) -> bool:
        """Undo ``sender``'s record (its publish failed), so the slot can be sent again."""
        return self._leases.release(slot_key(entry, slot), sender)

    def mark_skipped(self, entry: str, slot: dt.datetime, sender: str, reason: str) -> bool:
        """Note on ``sender``'s record that the slot was not sent (for people reading it):
        only the sender that recorded a slot may say what became of it."""
        value = f"{SKIPPED_MARK}{reason}:{sender}"
        return self._leases.replace(slot_key(entry, slot), sender, value)

    def holder(self, entry: str, slot: dt.datetime) -> str | None:
        return self._leases.holder(slot_key(entry, slot))
