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
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from jobs_platform.errors import ConfigError
from jobs_platform.metrics import names
from jobs_platform.metrics.counters import RecordedCounter

KEY_PREFIX = "jobs:rate:"
DEFERRED = RecordedCounter(names.RATE_DEFERRED)
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d*)\s*([smh])\s*$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}

# KEYS[1] the TAT (ms, Redis time), KEYS[2] the pause flag. ARGV[1] emission interval (ms).
# Returns 0 when the start is allowed (and takes it), else the milliseconds to wait.
_GCRA = """
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then return paused end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local interval = tonumber(ARGV[1])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat > now then return tat - now end
redis.call('SET', KEYS[1], now + interval, 'PX', math.ceil(interval) + 1000)
return 0
"""


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

    def acquire(self, key: str, rate: Rate | None) -> float:
        """Take a start under ``key``'s limit: 0.0 if allowed now, else seconds to wait.
        With no rate only a pause applies."""
        interval = 0.0 if rate is None else rate.interval_ms
        wait_ms = self._gcra(keys=[_tat_key(key), _pause_key(key)], args=[interval])
        return float(wait_ms) / 1000.0

    def pause(self, key: str, seconds: float) -> None:
        """Stop every start under ``key`` for ``seconds`` (a partner's ``Retry-After``);
        a longer pause already in force is kept."""
        ms = max(1, int(seconds * 1000))
        pause_key = _pause_key(key)
        if (self.client.pttl(pause_key) or 0) < ms:
            self.client.set(pause_key, "1", px=ms)


def _tat_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:tat"


def _pause_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:paused"


def limiter_for(url: str) -> RateLimiter:
    """This process's limiter on the coordination Redis at ``url``."""
    from jobs_platform.process_local import per_process, redis_client

    return per_process(("rate-limiter", url), lambda: RateLimiter(redis_client(url)))
