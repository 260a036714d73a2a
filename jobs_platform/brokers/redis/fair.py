"""Fair queues: a queue's keyed messages taken round robin across the keys with work.

A message carrying the :data:`~jobs_platform.brokers.interface.FAIRNESS_HEADER` (a task
declared with ``fairness_key``, dispatched at priority 0) is not pushed to its queue's
list but, by :data:`PUBLISH_SCRIPT`, to its key's own list, and the key joins the queue's
ring of keys with work:

- ``<queue><sep>fair``: the ring, a list of keys (a key is in it iff its list is not empty);
- ``<queue><sep>fair:<key>``: the key's messages (``LPUSH``, oldest at the tail, as kombu's);
- ``<queue><sep>fair#``: how many messages wait in all the key lists (the depth readers'
  O(1) count).

The kill-safe fetch (:mod:`.fetch`) looks at the ring right after the queue's base list:
it takes the tail of the ring head's list under the same ``unacked`` bookkeeping as any
message, then moves the head to the ring's tail (or drops it when its list is empty), all
in one script. A fetch costs the same few O(1) commands whatever the number of keys. A
message restored from ``unacked`` (a killed worker's, a visibility timeout) goes back to
the queue's ordinary list, as kombu restores every message: it is served first, not lost.
"""

from __future__ import annotations

from typing import Any

from jobs_platform.brokers.interface import FairKey

#: Suffix of a queue's ring (after kombu's ``sep``).
RING = "fair"
#: Between the ring's name and a key, for the key's list.
KEY_SEP = ":"
#: After the ring's name: the count of waiting keyed messages.
COUNT = "#"

#: KEYS[1]: the ring. ARGV[1]: the key; ARGV[2]: the message as kombu would LPUSH it.
PUBLISH_SCRIPT = """
local sub = KEYS[1] .. ':' .. ARGV[1]
if redis.call('LPUSH', sub, ARGV[2]) == 1 then redis.call('RPUSH', KEYS[1], ARGV[1]) end
redis.call('INCR', KEYS[1] .. '#')
return 1
"""

#: KEYS[1]: the ring. Deletes every key's list, the ring and the count; returns how many
#: messages waited (``celery purge`` counts them with the queue's own).
PURGE_SCRIPT = """
local n = tonumber(redis.call('GET', KEYS[1] .. '#') or '0')
for _, key in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    redis.call('DEL', KEYS[1] .. ':' .. key)
end
redis.call('DEL', KEYS[1], KEYS[1] .. '#')
return n
"""


def ring_key(queue_key: str, sep: str) -> str:
    """The ring of a queue whose base list is ``queue_key`` (prefix included)."""
    return f"{queue_key}{sep}{RING}"


def key_list(ring: str, key: str) -> str:
    return f"{ring}{KEY_SEP}{key}"


def count_key(ring: str) -> str:
    return f"{ring}{COUNT}"


def publish_args(ring: str, key: str, payload: str) -> tuple[Any, ...]:
    """``EVAL`` arguments publishing ``payload`` under ``key``."""
    return (PUBLISH_SCRIPT, 1, ring, key, payload)


def waiting(client: Any, ring: str) -> int:
    """Keyed messages waiting in the queue of ``ring`` (one ``GET``)."""
    return max(0, int(client.get(count_key(ring)) or 0))


def keys_with_work(client: Any, rings: dict[str, str]) -> list[FairKey]:
    """Every key with work on the queues of ``rings`` (queue -> ring key): ``LRANGE`` of
    each ring and ``LLEN`` of each key's list (cost grows with the keys, not the backlog)."""
    found: list[FairKey] = []
    for queue, ring in rings.items():
        keys = [k.decode() if isinstance(k, bytes) else str(k) for k in client.lrange(ring, 0, -1)]
        if not keys:
            continue
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key_list(ring, key))
        for position, (key, length) in enumerate(zip(keys, pipe.execute(), strict=True)):
            found.append(FairKey(queue, key, int(length), position))
    return found
