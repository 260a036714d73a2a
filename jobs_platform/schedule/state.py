"""What beats share in Redis besides the slot records: progress, ticks and skip counts.

``jobs:beat:done``     hash entry -> the newest slot decided (sent, skipped or dropped), in
                       epoch microseconds; only ever moves forward. A new leader resumes
                       from it, so slots missed while no beat ran are known (catch-up).
``jobs:beat:ticks``    hash entry -> ISO time of the leader's last tick that looked at the
                       entry (a stale one means no beat is running it).
``jobs:beat:skipped``  hash ``<reason>:<entry>`` -> slots skipped, for exporters (the
                       Prometheus counter lives in the beat process, which serves no
                       metrics itself).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

import redis

from jobs_platform.clock import utc_iso
from jobs_platform.coordination import lease
from jobs_platform.schedule.slots import EPOCH, KEY_PREFIX

DONE_KEY = KEY_PREFIX + "done"
TICKS_KEY = KEY_PREFIX + "ticks"
SKIPPED_KEY = KEY_PREFIX + "skipped"

# Move an entry's progress forward only: a leader that resumes after a pause must not
# take it back.
_ADVANCE = """
local current = redis.call('hget', KEYS[1], ARGV[1])
if current and tonumber(current) >= tonumber(ARGV[2]) then return 0 end
redis.call('hset', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


def to_micros(moment: dt.datetime) -> int:
    return (moment - EPOCH) // dt.timedelta(microseconds=1)


def from_micros(value: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=value)


class BeatState:
    """Progress, ticks and skip counts of the beat entries on one Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._advance = client.register_script(_ADVANCE)

    def done_up_to(self, entries: Sequence[str]) -> dict[str, dt.datetime | None]:
        """Each entry's newest decided slot (None: never seen by any beat)."""
        if not entries:
            return {}
        values = self.client.hmget(DONE_KEY, list(entries))
        return {
            name: None if value is None else from_micros(int(value))
            for name, value in zip(entries, values, strict=True)
        }

    def advance(self, entry: str, slot: dt.datetime) -> bool:
        """Record ``slot`` as decided for ``entry`` unless a newer one is."""
        return bool(self._advance(keys=[DONE_KEY], args=[entry, to_micros(slot)]))

    def record_ticks(self, entries: Iterable[str], now: dt.datetime) -> None:
        stamp = utc_iso(now)
        mapping = {name: stamp for name in entries}
        if mapping:
            self.client.hset(TICKS_KEY, mapping=mapping)  # type: ignore[arg-type]

    def forget_ticks(self, keep: Iterable[str]) -> int:
        """Drop the ticks of entries no longer in the schedule (their progress stays, so a
        restored entry resumes where it was)."""
        kept = set(keep)
        stale = [
            name
            for raw in self.client.hkeys(TICKS_KEY)
            if (name := raw.decode() if isinstance(raw, bytes) else str(raw)) not in kept
        ]
        return int(self.client.hdel(TICKS_KEY, *stale)) if stale else 0

    def ticks(self) -> dict[str, str]:
        return {lease.text(k): lease.text(v) for k, v in self.client.hgetall(TICKS_KEY).items()}

    def count_skip(self, entry: str, reason: str, count: int = 1) -> None:
        self.client.hincrby(SKIPPED_KEY, f"{reason}:{entry}", count)

    def skipped(self, entry: str, reason: str) -> int:
        value = self.client.hget(SKIPPED_KEY, f"{reason}:{entry}")
        return 0 if value is None else int(value)
