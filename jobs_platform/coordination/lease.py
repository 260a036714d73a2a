"""One lease primitive: a Redis key held by an owner for a while, changed only by its owner.

Unique dispatch, beat's leader lock, beat's per-slot records and overlap markers are all
this one thing, each a script of one round trip (so no gap in which a lease can vanish or
change hands between a read and a write):

- :meth:`Leases.acquire`: ``SET NX PX``, else read the holder;
- :meth:`Leases.hold`: extend our own lease, else take a free one (a leader's tick);
- :meth:`Leases.extend`: extend our own lease only;
- :meth:`Leases.release`: compare-and-delete: only the owner drops it;
- :meth:`Leases.replace`: compare-and-set, keeping the TTL (an owner annotating its record).

A lease may carry *companion* keys, written, extended and deleted with it (beat's overlap
marker keeps the run's entry under the run's task id beside the marker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# KEYS: the lease, then its companions. ARGV: owner, TTL ms, then each companion's value.
_ACQUIRE = """
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  for i = 2, #KEYS do redis.call('set', KEYS[i], ARGV[i + 1], 'PX', ARGV[2]) end
  return {ARGV[1], 1}
end
return {redis.call('get', KEYS[1]), 0}
"""
# 1 extended (ours), 2 taken (it was free), 0 held by someone else.
_HOLD = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
if not holder then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end
return 0
"""
_EXTEND = """
if redis.call('get', KEYS[1]) == ARGV[1] then
  for i = 2, #KEYS do redis.call('pexpire', KEYS[i], ARGV[2]) end
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
# Companions go whoever holds the lease: they are keyed by what the releaser owns.
_RELEASE = """
for i = 2, #KEYS do redis.call('del', KEYS[i]) end
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
_REPLACE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('set', KEYS[1], ARGV[2], 'KEEPTTL')
"""


def ttl_ms(seconds: float) -> int:
    """A TTL in whole milliseconds, never 0 (Redis refuses ``PX 0``)."""
    return max(1, int(seconds * 1000))


def text(value: Any) -> str:
    """A Redis reply as ``str`` (replies are bytes unless the client decodes them)."""
    return value.decode() if isinstance(value, bytes) else str(value)


class Leases:
    """The lease scripts on one Redis client (register once, run from any thread)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._acquire = client.register_script(_ACQUIRE)
        self._hold = client.register_script(_HOLD)
        self._extend = client.register_script(_EXTEND)
        self._release = client.register_script(_RELEASE)
        self._replace = client.register_script(_REPLACE)

    def acquire(
        self, key: str, owner: str, ttl_s: float, *, companions: Mapping[str, str] | None = None
    ) -> tuple[str, bool]:
        """``(holder, acquired_now)``: who holds ``key`` after this call."""
        return read_acquired(self.acquire_on(None, key, owner, ttl_s, companions=companions))

    def acquire_on(
        self,
        pipe: Any,
        key: str,
        owner: str,
        ttl_s: float,
        *,
        companions: Mapping[str, str] | None = None,
    ) -> Any:
        """:meth:`acquire` queued on ``pipe`` (its reply, for :func:`read_acquired`, comes
        from ``pipe.execute()``); with ``pipe`` None, run now and return the raw reply."""
        extra = dict(companions or {})
        return self._acquire(
            keys=[key, *extra], args=[owner, ttl_ms(ttl_s), *extra.values()], client=pipe
        )

    def hold(self, key: str, owner: str, ttl_s: float) -> int:
        """Extend ``owner``'s lease (1), take a free one (2), or 0: someone else holds it."""
        return int(self._hold(keys=[key], args=[owner, ttl_ms(ttl_s)]))

    def extend(self, key: str, owner: str, ttl_s: float, *, companions: Sequence[str] = ()) -> bool:
        """Give ``owner``'s lease (and its companions) ``ttl_s`` more, if it still holds it."""
        return bool(self.extend_on(None, key, owner, ttl_s, companions=companions))

    def extend_on(
        self, pipe: Any, key: str, owner: str, ttl_s: float, *, companions: Sequence[str] = ()
    ) -> Any:
        """:meth:`extend` queued on ``pipe`` (run now when ``pipe`` is None)."""
        return self._extend(keys=[key, *companions], args=[owner, ttl_ms(ttl_s)], client=pipe)

    def release(self, key: str, owner: str, *, companions: Sequence[str] = ()) -> bool:
        """Drop ``key`` if ``owner`` holds it (the companions go either way)."""
        return bool(self.release_on(None, key, owner, companions=companions))

    def release_on(self, pipe: Any, key: str, owner: str, *, companions: Sequence[str] = ()) -> Any:
        """:meth:`release` queued on ``pipe`` (run now when ``pipe`` is None)."""
        return self._release(keys=[key, *companions], args=[owner], client=pipe)

    def replace(self, key: str, owner: str, value: str) -> bool:
        """Set ``key`` to ``value`` (keeping its TTL) if ``owner`` holds it."""
        return bool(self._replace(keys=[key], args=[owner, value]))

    def holder(self, key: str) -> str | None:
        value = self.client.get(key)
        return None if value is None else text(value)


def read_acquired(reply: Any) -> tuple[str, bool]:
    """An acquire script's reply as ``(holder, acquired_now)``."""
    holder, acquired = reply
    return text(holder), bool(acquired)
