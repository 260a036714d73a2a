"""Per-key concurrency: at most ``concurrency_limit`` jobs of one key run at once, fleet-wide.

A key's slots are leases of the kind :mod:`jobs_platform.coordination.lease` defines (a
string holding its owner, the job's task id, with a TTL; changed only by its owner), on
the coordination Redis::

    jobs:flow:conc:<key>:slot:<i>   string, TTL JOBS_WORKER_LEASE   slot i (1..limit): its job
    jobs:flow:conc:<key>:waiting    sorted set                      task id -> when it queued
    jobs:flow:conc:<key>:wait       hash                            task id -> how to publish it
    jobs:flow:conc:gen:<task id>    string                          its current wait generation
    jobs:flow:conc:keys             sorted set                      key -> when a job last asked
    jobs:flow:conc:limits           hash                            key -> its limit, as last asked

- A job takes a free slot (or its own, after a lost attempt) when it starts; a pool thread
  (:class:`Keeper`) extends the slots its process holds every third of the lease, so a
  killed worker's slot runs out within ``JOBS_WORKER_LEASE`` (the bound the worker's own
  lease gives its jobs), never after an hour.
- A job with no free slot joins the key's wait list in the same script (so no release can
  slip between "full" and "waiting" unseen) and is re-published, same id, same attempt
  count, with a countdown until the soonest slot's lease would run out (the fallback:
  enough to see a dead holder's slot free; a live holder's is extended by then and the job
  waits again). Its pool slot is free at once.
- A job that ends (success, failure, retry) drops its slot and, in the same script, pops
  the oldest waiter: it re-publishes that waiter at once. So a waiter starts right after a
  slot frees, not after a back-off.

Each wait has a generation, a random token (:data:`GEN_HEADER` on its copies, the current
one under ``gen:<task id>``): the woken copy and the fallback copy carry the same one, the
first to arrive claims it and the other finds it gone and is dropped. A delivery without
the header (the first, or one retried after a lost attempt, whose retry drops it) makes a
new token, so every older copy is dropped too. A job therefore runs once, however it was
woken.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import uuid
from typing import Any

from jobs_platform import history
from jobs_platform.coordination import leases
from jobs_platform.coordination.lease import Leases, text, ttl_ms
from jobs_platform.process_local import per_process, redis_client

logger = logging.getLogger("jobs_platform.flow")

KEY_PREFIX = "jobs:flow:conc:"
#: Every key a job asked for lately (``flow list``), with its limit.
KEYS_KEY = KEY_PREFIX + "keys"
LIMITS_KEY = KEY_PREFIX + "limits"
GEN_HEADER = history.CONCURRENCY_GEN_HEADER
#: How long a wait's records outlive their last write: longer than any copy can wait.
KEEP_S = 24 * 3600.0
#: Added to the fallback countdown, so the soonest slot's lease has run out when it fires.
FALLBACK_SLACK_S = 0.25

# KEYS: the job's generation, the key's waiting set, the key's wait records, the registry
# of keys, their limits.
# ARGV: 1 owner (task id), 2 generation this copy carries ('' for a first delivery),
# 3 limit, 4 slot TTL ms, 5 slot key prefix, 6 the next generation, 7 the wait record,
# 8 how long wait records are kept (ms), 9 the key (for the registry of keys and limits).
# Returns {1, slot} run holding slot; {0, ms} wait (ms until the soonest slot runs out);
# {-1, 0} a copy of a wait another copy already claimed.
_TAKE = """
if ARGV[2] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[2] then return {-1, 0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[4], now, ARGV[9])
redis.call('HSET', KEYS[5], ARGV[9], ARGV[3])
local free, soonest = nil, -1
for i = 1, tonumber(ARGV[3]) do
  local slot = ARGV[5] .. i
  local holder = redis.call('GET', slot)
  if holder == ARGV[1] then
    free = i
    break
  end
  if not holder then
    free = free or i
  else
    local ttl = redis.call('PTTL', slot)
    if soonest < 0 or ttl < soonest then soonest = ttl end
  end
end
if free then
  redis.call('SET', ARGV[5] .. free, ARGV[1], 'PX', ARGV[4])
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return {1, free}
end
redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[8])
redis.call('ZADD', KEYS[2], 'NX', now, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[7])
redis.call('PEXPIRE', KEYS[2], ARGV[8])
redis.call('PEXPIRE', KEYS[3], ARGV[8])
return {0, soonest}
"""

# KEYS: the slot, the key's waiting set, its wait records. ARGV: owner.
# The lease's compare-and-delete, then the oldest waiter's record popped (or nil).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
while true do
  local head = redis.call('ZPOPMIN', KEYS[2])
  if #head == 0 then return false end
  local record = redis.call('HGET', KEYS[3], head[1])
  redis.call('HDEL', KEYS[3], head[1])
  if record then return record end
end
"""


def slot_prefix(key: str) -> str:
    return f"{KEY_PREFIX}{key}:slot:"


def waiting_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:waiting"


def records_key(key: str) -> str:
    return f"{KEY_PREFIX}{key}:wait"


def gen_key(task_id: str) -> str:
    return f"{KEY_PREFIX}gen:{task_id}"


@dataclasses.dataclass(frozen=True)
class Taken:
    """A job's answer: run holding ``slot`` (its lease key), wait ``wait_s`` at most before
    asking again, or drop this copy (``stale``: another copy of the wait claimed it)."""

    slot: str | None = None
    wait_s: float = 0.0
    stale: bool = False


class Slots:
    """The slot scripts on one Redis client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._take = client.register_script(_TAKE)
        self._release = client.register_script(_RELEASE)

    def take(
        self,
        key: str,
        limit: int,
        *,
        owner: str,
        generation: str | None,
        new_generation: str,
        record: str,
        ttl_s: float,
        fallback_max_s: float,
    ) -> Taken:
        """Take a slot of ``key`` for ``owner``, or join its wait list with ``record`` (the
        job as published again, carrying ``new_generation``). ``generation``: the one this
        copy carries (None: a delivery without one)."""
        status, value = self._take(
            keys=[gen_key(owner), waiting_key(key), records_key(key), KEYS_KEY, LIMITS_KEY],
            args=[
                owner,
                "" if generation is None else generation,
                limit,
                ttl_ms(ttl_s),
                slot_prefix(key),
                new_generation,
                record,
                ttl_ms(KEEP_S),
                key,
            ],
        )
        if int(status) == 1:
            return Taken(slot=f"{slot_prefix(key)}{int(value)}")
        if int(status) < 0:
            return Taken(stale=True)
        soonest_s = int(value) / 1000.0 if int(value) >= 0 else fallback_max_s
        return Taken(wait_s=min(fallback_max_s, soonest_s) + FALLBACK_SLACK_S)

    def release(self, key: str, slot: str, owner: str) -> str | None:
        """Drop ``owner``'s ``slot`` of ``key``; the record of the waiter to wake, if any."""
        record = self._release(keys=[slot, waiting_key(key), records_key(key)], args=[owner])
        return None if record is None else text(record)

    def waiting(self, key: str) -> int:
        return int(self.client.zcard(waiting_key(key)))


def new_generation() -> str:
    return uuid.uuid4().hex


class Keeper:
    """Extends the slots this process holds every third of their TTL, from a daemon
    thread: while the job runs its slot stays, and when the process dies it runs out."""

    def __init__(self, leases: Leases, ttl_s: float) -> None:
        self.leases = leases
        self.ttl_s = ttl_s
        self._held: dict[str, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def hold(self, slot: str, owner: str) -> None:
        with self._lock:
            self._held[slot] = owner
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="jobs-flow-slots", daemon=True
                )
                self._thread.start()

    def drop(self, slot: str) -> None:
        with self._lock:
            self._held.pop(slot, None)

    def close(self) -> None:
        """Stop extending (the thread ends at its next turn)."""
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            with self._lock:
                held = list(self._held.items())
            for slot, owner in held:
                try:
                    if not self.leases.extend(slot, owner, self.ttl_s):
                        logger.warning(
                            "jobs.flow.slot_lost: %s ran out before it was extended (the "
                            "process stalled longer than the lease)",
                            slot,
                            extra={"event": "jobs.flow.slot_lost"},
                        )
                except Exception:
                    logger.exception(
                        "jobs.flow.slot_extend_failed: %s not extended now",
                        slot,
                        extra={"event": "jobs.flow.slot_extend_failed"},
                    )


def slots_for(url: str) -> Slots:
    """This process's slot scripts on the coordination Redis at ``url``."""
    return per_process(("flow-slots", url), lambda: Slots(redis_client(url)))


def keeper_for(url: str, ttl_s: float) -> Keeper:
    """This process's slot keeper (one thread per process, started on first use)."""
    return per_process(("flow-keeper", url, ttl_s), lambda: Keeper(leases(url), ttl_s))
