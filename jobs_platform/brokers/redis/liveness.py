"""In-flight jobs owned by a live worker: a dead worker's jobs are back in seconds, and a
live worker's job is never handed to another, however long it runs.

kombu keeps a fetched, unacknowledged message in ``unacked`` with its fetch time in
``unacked_index``, and any worker's sweep puts back every entry older than the visibility
timeout (an hour by default): a SIGKILLed worker's job waits that long, and a job that runs
longer than it runs twice. Here every consuming channel is an *owner* (``host/pid/nonce``)
and keeps, on the broker's Redis::

    jobs:worker:alive:<owner>  string, TTL JOBS_WORKER_LEASE   its liveness lease
    jobs:worker:held:<owner>   set                            the delivery tags it holds
    jobs:worker:owners         set                            every owner with held jobs

- the kill-safe fetch (:mod:`.fetch`) records a message in ``unacked``, in its owner's held
  set and renews the owner's lease in one script;
- every restore interval (``JOBS_UNACKED_RESTORE_INTERVAL``), in the worker's own consuming
  loop, :data:`UPKEEP` renews the lease, moves the fetch time of every job the owner holds
  to now (so kombu's sweep never sees a live worker's job as expired), and claims the held
  sets of owners whose lease is gone, atomically: racing workers claim each set once;
- the claimer puts each claimed job back on its queue with kombu's own ``restore_by_tag``
  transaction (exactly once, whoever else tries), marked :data:`LOST_HEADER` when it may have
  been running (its ETA, if any, was due): the worker that takes it counts a lost attempt
  (:class:`jobs_platform.cooperative.watchdog.LostAttempts`): retried, or ``worker_lost`` once
  ``max_retries`` is spent, as Celery counts a lost pool child.

The visibility timeout stays as the backstop for a job whose owner's record was lost (a
claimer killed between its claim and its restores, a worker of an older release). A
worker whose loop stops (a hung consumer, a blocked gevent loop) stops renewing: its jobs
go to another worker within the lease, as they would if it were dead.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import time
import uuid
from typing import Any

from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads

from jobs_platform import history

logger = logging.getLogger("jobs_platform.broker")

KEY_PREFIX = "jobs:worker:"
OWNERS_KEY = KEY_PREFIX + "owners"
#: Set on a message put back because its owner's lease ran out (the value: that owner).
LOST_HEADER = history.LOST_WORKER_HEADER
#: Dead owners claimed per upkeep (more wait for the next one, a restore interval later).
CLAIM_LIMIT = 50

# KEYS: my alive key, my held set, the owners set, kombu's unacked index.
# ARGV: me, lease ms, now (seconds, kombu's index scores), key prefix, claim limit.
# Returns {owner, tag, owner, tag, ...}: the held jobs of owners whose lease is gone.
UPKEEP = """
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
redis.call('SADD', KEYS[3], ARGV[1])
for _, tag in ipairs(redis.call('SMEMBERS', KEYS[2])) do
  redis.call('ZADD', KEYS[4], 'XX', ARGV[3], tag)
end
local lost, claimed = {}, 0
for _, owner in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  if claimed >= tonumber(ARGV[5]) then break end
  if owner ~= ARGV[1] and redis.call('EXISTS', ARGV[4] .. 'alive:' .. owner) == 0 then
    local held = ARGV[4] .. 'held:' .. owner
    for _, tag in ipairs(redis.call('SMEMBERS', held)) do
      lost[#lost + 1] = owner
      lost[#lost + 1] = tag
    end
    redis.call('DEL', held)
    redis.call('SREM', KEYS[3], owner)
    claimed = claimed + 1
  end
end
return lost
"""


def new_owner() -> str:
    """A consuming channel's owner id: the host and process, and a nonce (a reconnect is a
    new channel: the jobs of the old one are not its to keep)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:10]}"


def alive_key(prefix: str, owner: str) -> str:
    return f"{prefix}{KEY_PREFIX}alive:{owner}"


def held_key(prefix: str, owner: str) -> str:
    return f"{prefix}{KEY_PREFIX}held:{owner}"


def lease_ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def may_have_run(message: dict[str, Any], now: dt.datetime) -> bool:
    """Whether a held message could have been running: not while it waited for its ETA."""
    eta = (message.get("headers") or {}).get("eta")
    if not isinstance(eta, str) or not eta:
        return True
    try:
        due = dt.datetime.fromisoformat(eta)
    except ValueError:
        return True
    if due.tzinfo is None:
        due = due.replace(tzinfo=dt.UTC)
    return due <= now


class OwnedQoS:
    """The QoS side of ownership, mixed into the platform's Redis QoS (:mod:`.reconnect`):
    the upkeep on kombu's restore cycle, the held set kept in step with acks."""

    channel: Any
    unacked_key: str
    unacked_index_key: str

    @property
    def jobs_owner(self) -> str:
        return str(self.channel.jobs_owner)

    def _jobs_held_key(self) -> str:
        return held_key(self.channel.global_keyprefix, self.jobs_owner)

    # -- kombu's hooks -------------------------------------------------------------------------

    def restore_visible(self, start: int = 0, num: int = 10, interval: int = 10) -> Any:
        """kombu calls this every restore interval in the consuming loop: the owner's upkeep
        first, then kombu's visibility-timeout sweep (the backstop)."""
        try:
            self.jobs_upkeep()
        except self.channel.connection_errors:
            raise
        except Exception:
            logger.exception(
                "jobs.broker.upkeep_failed: the worker lease could not be renewed now",
                extra={"event": "jobs.broker.upkeep_failed"},
            )
        return super().restore_visible(start, num, interval)  # type: ignore[misc]

    def _remove_from_indices(self, delivery_tag: Any, pipe: Any = None) -> Any:
        """An acked, rejected or restored job leaves its owner's held set too."""
        return (
            super()  # type: ignore[misc]
            ._remove_from_indices(delivery_tag, pipe)
            .srem(self._jobs_held_key(), delivery_tag)
        )

    # -- the upkeep ----------------------------------------------------------------------------

    def jobs_upkeep(self) -> int:
        """Renew this owner's lease, keep its jobs' fetch times fresh, and put back the jobs
        of owners whose lease is gone; how many were put back."""
        channel = self.channel
        prefix = channel.global_keyprefix
        owner = self.jobs_owner
        with channel.conn_or_acquire() as client:
            lost = client.eval(
                UPKEEP,
                4,
                alive_key(prefix, owner),
                held_key(prefix, owner),
                prefix + OWNERS_KEY,
                prefix + self.unacked_index_key,
                owner,
                lease_ms(float(channel.jobs_worker_lease)),
                repr(time.time()),
                prefix + KEY_PREFIX,
                CLAIM_LIMIT,
            )
            texts = [bytes_to_str(value) for value in lost]
            pairs = list(zip(texts[::2], texts[1::2], strict=True))
            restored = sum(self.jobs_restore_lost(tag, dead, client) for dead, tag in pairs)
        if pairs:
            logger.warning(
                "jobs.broker.lease_lost: %d job(s) of %d worker(s) whose lease ran out put "
                "back on their queues",
                restored,
                len({dead for dead, _ in pairs}),
                extra={"event": "jobs.broker.lease_lost", "messages": restored},
            )
        return restored

    def jobs_restore_lost(self, tag: str, owner: str, client: Any) -> bool:
        """kombu's ``restore_by_tag`` for a job of a dead owner, marked :data:`LOST_HEADER`
        when it may have been running; False if someone else had put it back already."""
        restored: list[bool] = []
        now = dt.datetime.now(dt.UTC)

        def restore(pipe: Any) -> None:
            raw = pipe.hget(self.unacked_key, tag)
            pipe.multi()
            super(OwnedQoS, self)._remove_from_indices(tag, pipe)  # type: ignore[misc]
            restored[:] = [raw is not None]
            if raw is None:
                return
            message, exchange, routing_key = loads(bytes_to_str(raw))
            if may_have_run(message, now):
                message.setdefault("headers", {})[LOST_HEADER] = owner
            self.channel._do_restore_message(message, exchange, routing_key, pipe)

        client.transaction(restore, self.unacked_key)
        return bool(restored and restored[0])
