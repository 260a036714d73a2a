"""Every Redis key ``health`` reads or writes (all on the coordination Redis), in one place.

Written by the health command and the canary (:mod:`.canary`):

- :func:`canary_inflight_key` (string, TTL): the canary in flight on a queue, as JSON
  ``{"id", "sent_at"}``; while it is there and not done, later runs wait on it instead of
  sending another, so a queue nobody consumes collects at most one canary per lifetime;
- :func:`canary_done_key` (string, TTL): set by the canary task when it ran in time.

Written by others and only read here (absent keys read as "never happened"):

- beat's ticks, :func:`beat_ticks_key` (hash: entry -> ISO time of the leader's last tick);
- the dead-letter spool (``JOBS_DLQ_SPOOL_KEY``, :mod:`jobs_platform.deadletter.spool`).

kombu's queue lists and their priority sub-lists are named by kombu itself
(:mod:`.checks` asks the transport's channel).
"""

from __future__ import annotations

from jobs_platform.schedule.state import TICKS_KEY

CANARY_PREFIX = "jobs:health:canary:"


def canary_inflight_key(queue: str) -> str:
    return f"{CANARY_PREFIX}inflight:{queue}"


def canary_done_key(canary_id: str) -> str:
    return f"{CANARY_PREFIX}done:{canary_id}"


def beat_ticks_key() -> str:
    """Beat's ticks hash (the scheduler's own name for it)."""
    return TICKS_KEY
