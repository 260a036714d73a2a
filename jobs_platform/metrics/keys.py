"""Every Redis key the metrics read or write, named in one place (the coordination Redis).

Written by the platform's processes (:mod:`.counters`):

- :data:`COUNTERS_KEY` (hash): one field per series (:func:`.counters.encode_field`), its
  value the series' total, raised with ``HINCRBYFLOAT`` by every process that counts;
- :data:`WORKERS_KEY` (hash): worker hostname -> Unix time it last reported in.

Written by others and only read here; their own modules name them, the defaults below
are used only when those modules are not there (an absent key reads as empty):

- the dead-letter spool (``JOBS_DLQ_SPOOL_KEY``) and its ``:rejected`` / ``:unreadable``
  side lists (:mod:`jobs_platform.deadletter.spool`);
- beat's ticks, :func:`beat_keys` (hash: entry -> ISO time of the leader's last tick) and
  skip counts (hash: ``<reason>:<entry>`` -> slots skipped; :mod:`jobs_platform.schedule.state`).

The broker's own structures (queues, in flight, the delayed store) are read through the
broker (:mod:`jobs_platform.brokers`).
"""

from __future__ import annotations

COUNTERS_KEY = "jobs:metrics:counters"
WORKERS_KEY = "jobs:metrics:workers"

DEFAULT_BEAT_TICKS_KEY = "jobs:beat:ticks"
DEFAULT_BEAT_SKIPPED_KEY = "jobs:beat:skipped"


def beat_keys() -> tuple[str, str]:
    """Beat's (ticks, skipped) hashes."""
    try:
        from jobs_platform.schedule.state import SKIPPED_KEY, TICKS_KEY
    except ImportError:
        return DEFAULT_BEAT_TICKS_KEY, DEFAULT_BEAT_SKIPPED_KEY
    return str(TICKS_KEY), str(SKIPPED_KEY)
