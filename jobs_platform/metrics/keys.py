"""The Redis keys the metrics write (on the coordination Redis), named in one place:

- :data:`COUNTERS_KEY` (hash): one field per series (:func:`.counters.encode_field`), its
  value the series' total, raised with ``HINCRBYFLOAT`` by every process that counts;
- :data:`WORKERS_KEY` (hash): worker hostname -> Unix time it last reported in.

What the exporter reads of other features (the spool, beat's ticks, the broker) is named by
those features and gathered in :mod:`jobs_platform.exporter.sources`.
"""

from __future__ import annotations

COUNTERS_KEY = "jobs:metrics:counters"
WORKERS_KEY = "jobs:metrics:workers"
