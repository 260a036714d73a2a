"""The leader lock: one beat sends, the others stand by and take over when it is gone.

``jobs:beat:leader:<app>`` is a lease (:mod:`jobs_platform.coordination.lease`) holding
the leader's id with a short TTL (``JOBS_BEAT_LOCK_TIMEOUT``,
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

from jobs_platform.coordination.lease import Leases
from jobs_platform.schedule.slots import KEY_PREFIX

LEADER_PREFIX = KEY_PREFIX + "leader:"


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
        self._leases = Leases(client)

    def hold(self) -> bool:
        """Extend the lock if ours, take it if free; True if we lead now."""
        return bool(self._leases.hold(self.key, self.holder, self.timeout_s))

    def release(self) -> bool:
        return self._leases.release(self.key, self.holder)

    def current(self) -> str | None:
        return self._leases.holder(self.key)
