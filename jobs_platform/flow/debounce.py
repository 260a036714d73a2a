"""Debounce: dispatches of one key inside the window collapse into one run with the last
dispatch's arguments, started once the key was quiet for ``debounce`` seconds, and at the
latest ``debounce_max`` after the first of them (so a steady stream still runs).

On the coordination Redis, per task and key::

    jobs:flow:debounce:<task>:<key>          hash    id, first, due (ms, Redis time), args
    jobs:flow:debounce:released:<task id>    string  the arguments of a run being published
    jobs:flow:debounce:windows               zset    [task, key] JSON -> when it opened

- The first dispatch of a quiet key makes the window (its id is the run's id) and
  publishes a *trigger*: a message of the task with that id, :data:`TRIGGER_HEADER` and a
  countdown of the window. Every later dispatch inside the window only replaces the
  arguments and moves ``due`` (one script, Redis's clock) and returns the same id.
- The trigger never runs the task: when it comes due and the key has been quiet it moves
  the window aside (``released``), publishes the run (same id, the last arguments) and
  drops the record; when the window moved on it is re-published to come back then. A
  trigger redelivered after its worker died finds the ``released`` record and publishes
  the run itself (at least once: a run published just before the kill may run twice,
  which the idempotency guards are for).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jobs_platform import history
from jobs_platform.coordination.lease import text, ttl_ms
from jobs_platform.process_local import per_process, redis_client

KEY_PREFIX = "jobs:flow:debounce:"
#: The windows opened lately (``flow list``); a closed one is pruned when it is read.
WINDOWS_KEY = KEY_PREFIX + "windows"
TRIGGER_HEADER = history.DEBOUNCE_HEADER
#: How long a window's record may outlive its ``debounce_max`` (a trigger held by a worker
#: that died comes back within the worker lease; this is far beyond it).
KEEP_S = 3600.0

# KEYS: the window, the registry of windows. ARGV: a new id, window ms, max ms, arguments
# JSON, keep ms, the window's registry entry.
# Returns {id, 1 when this dispatch opened the window, ms until it is due}.
_DISPATCH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = redis.call('HGET', KEYS[1], 'id')
if id then
  local first = tonumber(redis.call('HGET', KEYS[1], 'first'))
  local due = math.min(now + tonumber(ARGV[2]), first + tonumber(ARGV[3]))
  redis.call('HSET', KEYS[1], 'due', due, 'args', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'count', 1)
  return {id, 0, due - now}
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'first', now, 'due', now + tonumber(ARGV[2]),
           'args', ARGV[4], 'count', 1)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[5]))
redis.call('ZADD', KEYS[2], now, ARGV[6])
return {ARGV[1], 1, tonumber(ARGV[2])}
"""

# KEYS: the window, the released record. ARGV: the trigger's id, keep ms.
# Returns {0, ms}: not quiet yet, come back in ms; {1, args}: publish the run with args;
# {-1, ''}: a trigger whose run was published already.
_CLAIM = """
if redis.call('HGET', KEYS[1], 'id') == ARGV[1] then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local due = tonumber(redis.call('HGET', KEYS[1], 'due'))
  if now < due then return {0, tostring(due - now)} end
  local args = redis.call('HGET', KEYS[1], 'args')
  redis.call('SET', KEYS[2], args, 'PX', ARGV[2])
  redis.call('DEL', KEYS[1])
  return {1, args}
end
local args = redis.call('GET', KEYS[2])
if args then return {1, args} end
return {-1, ''}
"""

# KEYS: the window. ARGV: the id. A window whose trigger could not be published goes.
_ABANDON = """
if redis.call('HGET', KEYS[1], 'id') == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def window_key(task: str, key: str) -> str:
    return f"{KEY_PREFIX}{task}:{key}"


def released_key(task_id: str) -> str:
    return f"{KEY_PREFIX}released:{task_id}"


@dataclasses.dataclass(frozen=True)
class Dispatched:
    """One dispatch's place: the run's ``id``, whether it opened the window, when it is due."""

    id: str
    opened: bool
    due_in_s: float


@dataclasses.dataclass(frozen=True)
class Claim:
    """A trigger's answer: publish the run with ``arguments`` (kombu's JSON of ``[args,
    kwargs]``, the last dispatch's); come back in ``wait_s``; or nothing to do (``done``)."""

    arguments: str | None = None
    wait_s: float = 0.0
    done: bool = False


class Windows:
    """The debounce scripts on one Redis client."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._dispatch = client.register_script(_DISPATCH)
        self._claim = client.register_script(_CLAIM)
        self._abandon = client.register_script(_ABANDON)

    def dispatch(
        self, task: str, key: str, *, new_id: str, arguments: str, window_s: float, max_s: float
    ) -> Dispatched:
        run_id, opened, due_ms = self._dispatch(
            keys=[window_key(task, key), WINDOWS_KEY],
            args=[
                new_id,
                ttl_ms(window_s),
                ttl_ms(max_s),
                arguments,
                ttl_ms(KEEP_S),
                json.dumps([task, key]),
            ],
        )
        return Dispatched(text(run_id), bool(int(opened)), int(due_ms) / 1000.0)

    def claim(self, task: str, key: str, run_id: str) -> Claim:
        status, value = self._claim(
            keys=[window_key(task, key), released_key(run_id)], args=[run_id, ttl_ms(KEEP_S)]
        )
        if int(status) == 0:
            return Claim(wait_s=int(text(value)) / 1000.0)
        if int(status) < 0:
            return Claim(done=True)
        return Claim(arguments=text(value))

    def published(self, run_id: str) -> None:
        """The run is on its queue: its released record goes."""
        self.client.delete(released_key(run_id))

    def abandon(self, task: str, key: str, run_id: str) -> None:
        self._abandon(keys=[window_key(task, key)], args=[run_id])


def windows_for(url: str) -> Windows:
    """This process's debounce scripts on the coordination Redis at ``url``."""
    return per_process(("flow-debounce", url), lambda: Windows(redis_client(url)))
