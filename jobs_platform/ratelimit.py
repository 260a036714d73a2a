"""Global rate limits: one limit per downstream, shared by every worker (GCRA in Redis).

Celery's own ``rate_limit`` is a token bucket inside each worker that holds the message
while it waits: two workers send twice the rate, and a waiting job blocks its prefetch
slot. Here the limit is one key on the coordination Redis, checked atomically by a script
that uses Redis's clock (no skew between workers). A job over the limit is not run: the
worker re-publishes it to wake up when its turn comes (same task id, same attempt count,
so no attempt is burned) and the pool slot is free at once. A ``429`` with
``Retry-After`` pauses the key for every worker.

The algorithm is GCRA (the "virtual scheduling" form of a leaky bucket): each start
moves the key's theoretical arrival time (TAT) one emission interval (period / count)
forward; a start is allowed when the TAT is not in the future. Starts are spread evenly,
so no 1-second window ever sees more than the rate (plus one at a window's edge).

A job over the limit *reserves* its own future slot: the script moves the TAT past it at
once and tells the job when its slot is, so every deferred job comes back at a different
moment and runs then without asking again (:data:`SLOT_HEADER` on its message), instead of
all of them waking at the same TAT and deferring again (79 jobs at 5/s made 835 deferrals
before; now each over-limit job is deferred once). A reservation that comes back more than
:data:`LATE_SLOTS` intervals late is stale (the worker was busy or down): it asks again,
so late jobs never start together beyond the rate.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from jobs_platform import history
from jobs_platform.errors import ConfigError
from jobs_platform.metrics import names
from jobs_platform.metrics.counters import RecordedCounter

KEY_PREFIX = "jobs:rate:"
DEFERRED = RecordedCounter(names.RATE_DEFERRED)
#: A deferred job's reserved slot (ms, Redis time): it starts then without asking again.
SLOT_HEADER = history.RATE_SLOT_HEADER
#: A reservation more than this many emission intervals late is asked again.
LATE_SLOTS = 1.0
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*([smh])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}

# KEYS[1] the TAT (ms, Redis time), KEYS[2] the pause flag. ARGV[1] emission interval (ms),
# ARGV[2] the job's reserved slot (ms) or '', ARGV[3] how late a reservation may be (ms).
# Returns {wait ms, slot ms}: {0, 0} start now; {w, 0} paused for w ms (no reservation);
# {w, s} over the limit, slot s reserved, w ms from now (or a reservation not yet due).
_GCRA = """
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then return {paused, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local slot = tonumber(ARGV[2])
if slot then
  if now < slot then return {slot - now, slot} end
  if now - slot <= tonumber(ARGV[3]) then return {0, 0} end
end
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat <= now then
  redis.call('SET', KEYS[1], now + interval, 'PX', math.ceil(interval) + 1000)
  return {0, 0}
end
redis.call('SET', KEYS[1], tat + interval, 'PX', math.ceil(tat + interval - now) + 1000)
return {tat - now, tat}
"""


@dataclasses.dataclass(frozen=True)
class Grant:
    """A rate limiter's answer: start now (``wait_s`` 0), or wait, holding ``slot_ms`` (the
    reserved start, Redis time) when it is a reservation rather than a pause."""

    wait_s: float
    slot_ms: int | None = None


@dataclasses.dataclass(frozen=True)
class Rate:
    """``count`` starts per ``period_s`` seconds (Celery's ``"10/s"``, ``"100/m"``, ``"5/2h"``)."""

    count: float
    period_s: float

    @property
    def interval_ms(self) -> float:
        return 1000.0 * self.period_s / self.count

    def __str__(self) -> str:
        return f"{self.count:g}/{self.period_s:g}s"


def parse_rate(value: Any, *, task: str) -> Rate | None:
    """``rate_limit`` as declared: ``None``, or ``"N/s"``, ``"N/m"``, ``"N/h"`` (also
    ``"N/10s"``); anything else is refused at declaration."""
    if value is None:
        return None
    match = _RATE.match(str(value)) if isinstance(value, str) else None
    if match is None or float(match[1]) <= 0:
        raise ConfigError(
            f"task {task!r}: rate_limit must look like '10/s', '100/m' or '5/h', got {value!r}"
        )
    return Rate(float(match[1]), float(match[2] or 1) * _UNIT_S[match[3]])


class RateLimiter:
    """The shared limits on one Redis (the broker's)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._gcra = client.register_script(_GCRA)

    def acquire(self, key: str, rate: Rate | None, *, slot_ms: int | None = None) -> Grant:
        """Take a start under ``key``'s limit, or a reservation of a later one. ``slot_ms``:
        the slot this job reserved when it was deferred. With no rate only a pause applies."""
        interval = 0.0 if rate is None else rate.interval_ms
        wait_ms, slot = self._gcra(
            keys=[tat_key(key), pause_key(key)],
            args=[interval, "" if slot_ms is None else slot_ms, LATE_SLOTS * interval],
        )
        return Grant(float(wait_ms) / 1000.0, int(slot) or None)

    def pause(self, key: str, seconds: float) -> None:
        """Stop every start under ``key`` for ``seconds`` (a partner's ``Retry-After``);
        a longer pause already in force is kept."""
        ms = max(1, int(seconds * 1000))
        paused = pause_key(key)
        if (self.client.pttl(paused) or 0) < ms:
            self.client.set(paused, "1", px=ms)


def tat_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:tat"


def pause_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:paused"


def limiter_for(url: str) -> RateLimiter:
    """This process's limiter on the coordination Redis at ``url``."""
    from jobs_platform.process_local import per_process, redis_client

    return per_process(("rate-limiter", url), lambda: RateLimiter(redis_client(url)))
