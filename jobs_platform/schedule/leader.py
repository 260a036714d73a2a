"""The leader lock: one beat sends, the others stand by and take over when it is gone.

``jobs:beat:leader:<app>`` holds the leader's id with a short TTL (``JOBS_BEAT_LOCK_TIMEOUT``,
5 s); the leader extends it on every tick (at least every ``beat_max_loop_interval``) and
deletes it when it stops. A standby tries to take it on each of its ticks, so after a
leader dies the standby leads within the lock timeout plus one loop interval.

The lock decides who *tries* to send; it is not what makes a slot go out once. A leader
paused past its TTL (a stopped VM, a long GC) can resume believing it leads while the
standby already does: the per-slot record (:mod:`.slots`) keeps that from sending a slot
twice.
"""

from __future__ import annotations

import redis

from jobs_platform.schedule.slots import KEY_PREFIX

LEADER_PREFIX = KEY_PREFIX + "leader:"

# Extend our own lock, else take a free one; 1 extended, 2 taken, 0 held by someone else.
_HOLD = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
if not holder then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 2 end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


def leader_key(app_name: str) -> str:
    return LEADER_PREFIX + app_name


class LeaderLock:
    """The leader lock of one app's beats, held (or wanted) by ``holder``."""

    def __init__(self, client: redis.Redis, app_name: str, holder: str, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"lock timeout must be > 0 s, got {timeout_s}")
        self.client = client
        self.key = leader_key(app_name)
        self.holder = holder
        self.timeout_s = timeout_s
        self._hold = client.register_script(_HOLD)
        self._release = client.register_script(_RELEASE)

    def hold(self) -> bool:
        """Extend the lock if ours, take it if free; True if we lead now."""
        return bool(self._hold(keys=[self.key], args=[self.holder, int(self.timeout_s * 1000)]))

    def release(self) -> bool:
        return bool(self._release(keys=[self.key], args=[self.holder]))

    def current(self) -> str | None:
        value = self.client.get(self.key)
        if value is None:
            return None
        return value.decode() if isinstance(value, bytes) else str(value)
