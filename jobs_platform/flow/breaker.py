"""A circuit breaker per downstream (a task's ``rate_key``), shared by every worker.

Closed, a key's transient failures are counted; ``threshold`` of them in a row (no success
between them) inside ``window`` seconds open it. Open, every job of the key is deferred
(re-published, same id, same attempt count: no attempt burned, no dead letter, no pool
slot held) until the cool-down has passed. Then the breaker is half-open: the first job
to arrive claims the probe (a lease of :mod:`jobs_platform.coordination.lease`, so one
holder however many workers race, and a dead probe's claim runs out) and runs; its
success closes the breaker, its transient failure re-opens it for another cool-down.

On the coordination Redis, per key, every transition one script on Redis's clock::

    jobs:flow:breaker:<key>            hash    state (open, half_open; none: closed),
                                               opened_at, until (ms), opens, threshold,
                                               window, cooldown (as last configured)
    jobs:flow:breaker:<key>:failures   zset    failure -> when (ms), inside the window
    jobs:flow:breaker:<key>:probe      string  the probe's lease: its task id, with a TTL
    jobs:flow:breaker:keys             zset    key -> when a job last asked (``flow list``)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from jobs_platform.coordination import leases
from jobs_platform.coordination.lease import Leases, text, ttl_ms
from jobs_platform.flow.options import Breaker
from jobs_platform.process_local import per_process, redis_client

KEY_PREFIX = "jobs:flow:breaker:"
KEYS_KEY = KEY_PREFIX + "keys"
#: How long a key's records outlive their last write (an open breaker is written at least
#: once per cool-down, which is at most JOBS_MAX_DELAY).
KEEP_S = 7 * 24 * 3600.0
#: The probe's claim lasts its hard time limit plus this (a killed probe frees it then).
PROBE_SLACK_S = 30.0

State = Literal["closed", "open", "half_open"]
#: ``jobs_breaker_state``'s value of each state.
STATE_VALUES: dict[str, int] = {"closed": 0, "open": 1, "half_open": 2}

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: the state, the probe lease, the registry. ARGV: 1 owner (task id), 2 cool-down ms,
# 3 the key (registry), 4 keep ms.
# Returns {0, 0} run (closed); {1, ms} deferred, open for ms more; {2, 0} may probe (the
# cool-down passed, or this job holds the probe already); {3, ms} a probe runs: come back
# in ms.
_ADMIT = (
    _NOW
    + """
redis.call('ZADD', KEYS[3], now, ARGV[3])
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return {0, 0} end
if state == 'open' then
  local left = tonumber(redis.call('HGET', KEYS[1], 'until')) - now
  if left > 0 then return {1, left} end
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'half_open_at', now)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {2, 0}
end
local holder = redis.call('GET', KEYS[2])
if not holder or holder == ARGV[1] then return {2, 0} end
return {3, math.max(1, math.min(tonumber(ARGV[2]), redis.call('PTTL', KEYS[2])))}
"""
)

# KEYS: the state, the failures, the probe lease. ARGV: 1 owner, 2 a unique member,
# 3 threshold, 4 window ms, 5 cool-down ms, 6 keep ms.
# Returns {0, n} counted (n in a row inside the window); {1, until} opened by this failure
# (or re-opened by the probe's); {2, 0} not counted (open already, or a job other than the
# probe failing while it runs).
_FAILURE = (
    _NOW
    + """
local state = redis.call('HGET', KEYS[1], 'state')
local function open()
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now,
             'until', now + tonumber(ARGV[5]))
  redis.call('HINCRBY', KEYS[1], 'opens', 1)
  redis.call('DEL', KEYS[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return {1, now + tonumber(ARGV[5])}
end
if state == 'half_open' then
  if redis.call('GET', KEYS[3]) == ARGV[1] then
    redis.call('DEL', KEYS[3])
    return open()
  end
  return {2, 0}
end
if state then return {2, 0} end
redis.call('ZADD', KEYS[2], now, ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[4]))
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('HSET', KEYS[1], 'threshold', ARGV[3], 'window', ARGV[4], 'cooldown', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
local count = redis.call('ZCARD', KEYS[2])
if count >= tonumber(ARGV[3]) then return open() end
return {0, count}
"""
)

# KEYS: the state, the failures, the probe lease. ARGV: owner.
# Returns 1 when the probe's success closed the breaker; 0 otherwise (a success while
# closed ends the run of failures; one while open or during another's probe changes nothing).
_SUCCESS = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('DEL', KEYS[2])
  return 0
end
if state == 'half_open' and redis.call('GET', KEYS[3]) == ARGV[1] then
  redis.call('DEL', KEYS[3])
  redis.call('HDEL', KEYS[1], 'state', 'opened_at', 'until', 'half_open_at')
  redis.call('HSET', KEYS[1], 'closed_at', redis.call('TIME')[1])
  return 1
end
return 0
"""


def state_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}"


def failures_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:failures"


def probe_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:probe"


@dataclasses.dataclass(frozen=True)
class Admission:
    """A job's answer: run (``probe``: as the half-open breaker's one probe), or wait
    ``wait_s`` and ask again (``state``: why)."""

    run: bool
    probe: bool = False
    wait_s: float = 0.0
    state: State = "closed"


@dataclasses.dataclass(frozen=True)
class Failure:
    """What a counted failure did: ``opened`` the breaker (until ``until_ms``, Redis time),
    or added to the run of ``in_a_row`` failures."""

    opened: bool
    in_a_row: int = 0
    until_ms: int | None = None


class Breakers:
    """The breaker scripts on one Redis client; the probe's claim is a lease."""

    def __init__(self, client: Any, lease_scripts: Leases) -> None:
        self.client = client
        self.leases = lease_scripts
        self._admit = client.register_script(_ADMIT)
        self._failure = client.register_script(_FAILURE)
        self._success = client.register_script(_SUCCESS)

    def admit(self, breaker: Breaker, owner: str, *, probe_ttl_s: float) -> Admission:
        """Whether ``owner`` (a task id) may call ``breaker``'s downstream now."""
        key = breaker.key
        status, value = self._admit(
            keys=[state_key(key), probe_key(key), KEYS_KEY],
            args=[owner, ttl_ms(breaker.cooldown_s), key, ttl_ms(KEEP_S)],
        )
        status = int(status)
        if status == 0:
            return Admission(run=True)
        if status == 1:
            return Admission(run=False, wait_s=int(value) / 1000.0, state="open")
        if status == 3:
            return Admission(run=False, wait_s=int(value) / 1000.0, state="half_open")
        holder, _ = self.leases.acquire(probe_key(key), owner, probe_ttl_s)
        if holder == owner:
            return Admission(run=True, probe=True, state="half_open")
        # Another job claimed the probe between the two calls.
        left = self.client.pttl(probe_key(key))
        wait_ms = min(ttl_ms(breaker.cooldown_s), max(1, int(left)))
        return Admission(run=False, wait_s=wait_ms / 1000.0, state="half_open")

    def failed(self, breaker: Breaker, owner: str, member: str) -> Failure:
        """Count a transient failure of ``owner``'s attempt (``member``: unique per attempt)."""
        key = breaker.key
        status, value = self._failure(
            keys=[state_key(key), failures_key(key), probe_key(key)],
            args=[
                owner,
                member,
                breaker.threshold,
                ttl_ms(breaker.window_s),
                ttl_ms(breaker.cooldown_s),
                ttl_ms(KEEP_S),
            ],
        )
        if int(status) == 1:
            return Failure(opened=True, until_ms=int(value))
        return Failure(opened=False, in_a_row=int(value))

    def succeeded(self, breaker: Breaker, owner: str) -> bool:
        """A success of ``owner``'s call: True when it was the probe and closed the breaker."""
        key = breaker.key
        return bool(
            self._success(keys=[state_key(key), failures_key(key), probe_key(key)], args=[owner])
        )

    def release_probe(self, breaker: Breaker, owner: str) -> None:
        """The probe ended saying nothing of the downstream (a permanent error: the job's
        own fault): its claim goes, so the next job probes."""
        self.leases.release(probe_key(breaker.key), owner)


@dataclasses.dataclass(frozen=True)
class Reading:
    """One key's breaker as ``flow list|show``, the exporter and ``health`` show it."""

    key: str
    state: State
    #: Transient failures in a row inside the window (closed).
    failures: int
    threshold: int | None
    window_s: float | None
    cooldown_s: float | None
    #: Unix time it last opened (None: never, or it closed since).
    opened_at: float | None
    #: Seconds until the cool-down ends and a job may probe (open), else None.
    next_probe_in_s: float | None
    #: The job probing now (half-open), if any.
    probe: str | None
    #: Times it opened since its records were made.
    opens: int

    @property
    def value(self) -> int:
        return STATE_VALUES[self.state]


def read(client: Any, key: str, now_ms: int) -> Reading:
    """``key``'s breaker at ``now_ms`` (Redis time): two round trips."""
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(state_key(key))
    pipe.get(probe_key(key))
    raw, probe = pipe.execute()
    fields = {text(k): text(v) for k, v in raw.items()}
    state: State = "closed"
    if fields.get("state") in ("open", "half_open"):
        state = "open" if fields["state"] == "open" else "half_open"
    window = _number(fields.get("window"))
    # The set is trimmed only when a failure is counted: count the window's own.
    failures = client.zcount(failures_key(key), now_ms - (window or 0), "+inf") if window else 0
    until = _number(fields.get("until"))
    opened_at = _number(fields.get("opened_at")) if state != "closed" else None
    return Reading(
        key=key,
        state=state,
        failures=int(failures),
        threshold=None if fields.get("threshold") is None else int(fields["threshold"]),
        window_s=None if window is None else window / 1000.0,
        cooldown_s=None if fields.get("cooldown") is None else int(fields["cooldown"]) / 1000,
        opened_at=None if opened_at is None else opened_at / 1000.0,
        next_probe_in_s=(
            max(0.0, (until - now_ms) / 1000.0) if state == "open" and until is not None else None
        ),
        probe=None if probe is None or state != "half_open" else text(probe),
        opens=int(fields.get("opens", "0")),
    )


def _number(value: str | None) -> float | None:
    return None if value is None else float(value)


def known_keys(client: Any) -> list[str]:
    """Every key a job of a breaker task asked for (pruned after :data:`KEEP_S`)."""
    seconds, _ = client.time()
    client.zremrangebyscore(KEYS_KEY, "-inf", (int(seconds) - KEEP_S) * 1000)
    return [text(k) for k in client.zrange(KEYS_KEY, 0, -1)]


def breakers_for(url: str) -> Breakers:
    """This process's breaker scripts on the coordination Redis at ``url``."""
    return per_process(("flow-breakers", url), lambda: Breakers(redis_client(url), leases(url)))
