"""The delayed store: a sorted set and a hash on the broker's Redis, moved by Lua scripts.

::

    <prefix>:due         sorted set   task id -> due time (ms since the epoch)
    <prefix>:jobs        hash         task id -> DelayedJob JSON (list key, exact payload)
    <prefix>:unreadable  hash         task id -> an entry the release script could not read

Storing (ZADD + HSET), releasing (LPUSH onto the queue + ZREM + HDEL) and cancelling
(ZREM + HDEL) are each one script, so each is atomic: a job is in the store or in its
queue, never both and never neither, and any number of releasers can run at once (each
due job is moved by exactly one script run). One job per task id: storing the same id
again (a publish retried after a lost reply) replaces it instead of making a copy.

Releasing uses the Redis server's clock, so releasers on different machines agree on what
is due.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

#: Key prefix when the app sets none (``JOBS_DELAYED_KEY_PREFIX``).
DEFAULT_PREFIX = "jobs:delayed"
#: Jobs moved per release script run: one run blocks Redis ~8 ms (60,000 jobs/s here).
RELEASE_BATCH = 500

# KEYS: due, jobs. ARGV: task id, due (ms), record JSON.
STORE = """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""

# KEYS: due, jobs, unreadable. ARGV: batch size, now (ms) or '' for the server's clock.
# Returns {now, unreadable count, due score of each released job...}. An entry that is not
# a readable record is moved aside (never retried forever, never blocking the others).
RELEASE = """
local now = tonumber(ARGV[2])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES',
                       'LIMIT', 0, tonumber(ARGV[1]))
local out = {now, 0}
for i = 1, #due, 2 do
  local id = due[i]
  local raw = redis.call('HGET', KEYS[2], id)
  local ok, job = false, nil
  if raw then ok, job = pcall(cjson.decode, raw) end
  if ok and type(job) == 'table' and type(job.list) == 'string'
      and type(job.payload) == 'string' then
    redis.call('LPUSH', job.list, job.payload)
    out[#out + 1] = due[i + 1]
  else
    if raw then redis.call('HSET', KEYS[3], id, raw) end
    out[2] = out[2] + 1
  end
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
return out
"""

# KEYS: due, jobs. ARGV: task id. Returns the record removed, or nil if it was not there.
CANCEL = """
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return false end
local raw = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
return raw or ''
"""


@dataclasses.dataclass(frozen=True)
class Keys:
    """The store's Redis keys under one prefix."""

    prefix: str = DEFAULT_PREFIX

    @property
    def due(self) -> str:
        return f"{self.prefix}:due"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    @property
    def unreadable(self) -> str:
        return f"{self.prefix}:unreadable"


@dataclasses.dataclass(frozen=True)
class DelayedJob:
    """One stored message: where it goes, what exactly is pushed there, and when."""

    id: str
    #: The Redis list the payload is LPUSHed onto (the queue's priority sub-list).
    list: str
    #: The exact string kombu's Redis transport would have LPUSHed.
    payload: str
    task: str
    queue: str
    priority: int
    #: Due time, ms since the epoch (the message's ETA).
    due: int
    #: The message's ``eta`` header, as sent.
    eta: str
    #: When it was stored, ms since the epoch (the publisher's clock).
    stored: int

    def to_json(self) -> str:
        # Not ASCII-escaped: the script's JSON decoder then only unescapes quotes and
        # backslashes, so the payload it pushes is byte-for-byte the one stored.
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> DelayedJob:
        data = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def message(self) -> dict[str, Any]:
        """The kombu message dict (headers, properties, body as sent)."""
        value = json.loads(self.payload)
        return value if isinstance(value, dict) else {}


def store_args(keys: Keys, job: DelayedJob) -> tuple[Any, ...]:
    """``EVAL`` arguments that store ``job`` (for a client or a pipeline's ``eval``)."""
    return (STORE, 2, keys.due, keys.jobs, job.id, job.due, job.to_json())


@dataclasses.dataclass
class Released:
    """What one :func:`release_due` call moved."""

    count: int = 0
    #: Entries that were not readable records, moved to ``<prefix>:unreadable``.
    unreadable: int = 0
    #: Per released job, how late it was moved (ms after its due time, server clock).
    lateness_ms: list[int] = dataclasses.field(default_factory=list)


def release_due(
    client: Any,
    keys: Keys,
    *,
    batch: int = RELEASE_BATCH,
    limit: int | None = None,
    now_ms: int | None = None,
) -> Released:
    """Move every job due by now (at most ``limit``) onto its queue; what was moved.

    Safe to call from any number of processes at once (each job is moved by exactly one
    script run). ``now_ms`` replaces the server's clock (tests).
    """
    script = client.register_script(RELEASE)
    done = Released()
    while limit is None or done.count + done.unreadable < limit:
        size = batch if limit is None else min(batch, limit - done.count - done.unreadable)
        reply = script(
            keys=[keys.due, keys.jobs, keys.unreadable],
            args=[size, "" if now_ms is None else now_ms],
        )
        now, unreadable, scores = int(reply[0]), int(reply[1]), reply[2:]
        done.count += len(scores)
        done.unreadable += unreadable
        done.lateness_ms.extend(max(0, now - round(float(s))) for s in scores)
        if len(scores) + unreadable < size:
            break
    return done


def cancel(client: Any, keys: Keys, task_id: str) -> DelayedJob | None:
    """Remove ``task_id`` from the store; the job removed, or ``None`` if it was not there."""
    raw = client.eval(CANCEL, 2, keys.due, keys.jobs, task_id)
    return None if raw is None else _parse(task_id, raw)


def get(client: Any, keys: Keys, task_id: str) -> DelayedJob | None:
    raw = client.hget(keys.jobs, task_id)
    return None if raw is None else _parse(task_id, raw)


def count(client: Any, keys: Keys) -> int:
    return int(client.zcard(keys.due))


def scan(
    client: Any,
    keys: Keys,
    *,
    due_after_ms: float | None = None,
    due_before_ms: float | None = None,
    chunk: int = 500,
) -> Iterator[DelayedJob]:
    """Stored jobs in due order, optionally only those due in ``[after, before]``.

    Pages by due time, not by offset: jobs released meanwhile (the earliest ones) must not
    shift the window and hide jobs that are still waiting.
    """
    low: Any = "-inf" if due_after_ms is None else due_after_ms
    high: Any = "+inf" if due_before_ms is None else due_before_ms
    seen_at_low: set[bytes | str] = set()  # ids already yielded whose score is ``low``
    while True:
        rows = client.zrangebyscore(
            keys.due, low, high, start=0, num=chunk + len(seen_at_low), withscores=True
        )
        fresh = [(i, s) for i, s in rows if not (s == low and i in seen_at_low)]
        if not fresh:
            return
        last = fresh[-1][1]
        seen_at_low = {i for i, s in rows if s == last} if last == low else set()
        seen_at_low |= {i for i, s in fresh if s == last}
        low = last
        ids = [i for i, _ in fresh]
        for task_id, raw in zip(ids, client.hmget(keys.jobs, ids), strict=True):
            if raw is not None:  # released or cancelled since the range was read
                yield _parse(task_id, raw)


def _parse(task_id: bytes | str, raw: bytes | str) -> DelayedJob:
    """The stored record; a record that does not read (never written by this code) still
    shows up, as task ``?``, so it can be listed and cancelled instead of breaking reads."""
    try:
        return DelayedJob.from_json(raw)
    except (ValueError, TypeError):
        name = task_id.decode() if isinstance(task_id, bytes) else task_id
        return DelayedJob(name, "", "", "?", "?", 0, 0, "", 0)


class RedisDelayedStore:
    """The store of one app, on its broker's Redis (what ``delayed`` and revoke use)."""

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def count(self) -> int:
        return count(self.client, self.keys)

    def next_due_s(self) -> tuple[int, float | None]:
        """How many jobs wait, and when the next one is due (Unix seconds; None: none)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.due)
        pipe.zrange(self.keys.due, 0, 0, withscores=True)
        waiting, first = pipe.execute()
        return int(waiting), (float(first[0][1]) / 1000 if first else None)

    def scan(
        self, *, due_after_ms: float | None = None, due_before_ms: float | None = None
    ) -> Iterator[DelayedJob]:
        return scan(self.client, self.keys, due_after_ms=due_after_ms, due_before_ms=due_before_ms)

    def get(self, task_id: str) -> DelayedJob | None:
        return get(self.client, self.keys, task_id)

    def cancel(self, task_id: str) -> DelayedJob | None:
        return cancel(self.client, self.keys, task_id)

    def release(self, *, limit: int | None = None) -> Released:
        return release_due(self.client, self.keys, limit=limit)
