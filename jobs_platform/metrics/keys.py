"""Every Redis key the metrics read or write, named in one place (on the broker's Redis).

Written by the platform's processes (:mod:`.counters`):

- :data:`COUNTERS_KEY` (hash): one field per series (:func:`.counters.encode_field`), its
  value the series' total, raised with ``HINCRBYFLOAT`` by every process that counts;
- :data:`WORKERS_KEY` (hash): worker hostname -> Unix time it last reported in.

Written by others and only read here; their own modules name them, the defaults below
are used only when those modules are not there (an absent key reads as empty):

- the dead-letter spool (``JOBS_DLQ_SPOOL_KEY``) and its ``:rejected`` / ``:unreadable``
  side lists (:mod:`jobs_platform.deadletter.spool`);
- the delayed store's due index, :func:`delayed_key` (sorted set: task id -> due time in
  ms since the epoch; :mod:`jobs_platform.delayed.store`);
- beat's ticks, :func:`beat_keys` (hash: entry -> ISO time of the leader's last tick) and
  skip counts (hash: ``<reason>:<entry>`` -> slots skipped; :mod:`jobs_platform.schedule.state`).

kombu's own keys (queue lists and their priority sub-lists, ``unacked``,
``unacked_index``) come from the app's transport options (:mod:`.queues`).
"""

from __future__ import annotations

from typing import Any

COUNTERS_KEY = "jobs:metrics:counters"
WORKERS_KEY = "jobs:metrics:workers"

DEFAULT_DELAYED_KEY = "jobs:delayed:due"
DEFAULT_BEAT_TICKS_KEY = "jobs:beat:ticks"
DEFAULT_BEAT_SKIPPED_KEY = "jobs:beat:skipped"


def delayed_key(app: Any) -> str:
    """The delayed store's due index for ``app`` (its key prefix is a transport option)."""
    try:
        from jobs_platform.delayed.options import keys_for
    except ImportError:
        return DEFAULT_DELAYED_KEY
    return str(keys_for(app).due)


def beat_keys() -> tuple[str, str]:
    """Beat's (ticks, skipped) hashes."""
    try:
        from jobs_platform.schedule.state import SKIPPED_KEY, TICKS_KEY
    except ImportError:
        return DEFAULT_BEAT_TICKS_KEY, DEFAULT_BEAT_SKIPPED_KEY
    return str(TICKS_KEY), str(SKIPPED_KEY)
