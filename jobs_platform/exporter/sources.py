"""What the exporter reads, and where: each feature names its own keys, gathered here.

- the broker's queues, in-flight jobs and delayed store, through the broker
  (:mod:`jobs_platform.brokers`);
- on the coordination Redis: the counters and live-workers hashes the workers write
  (:mod:`jobs_platform.metrics.keys`), the dead-letter spool (``JOBS_DLQ_SPOOL_KEY``) and
  its ``:rejected`` / ``:unreadable`` side lists (:mod:`jobs_platform.deadletter.spool`),
  beat's ticks and skip counts (:mod:`jobs_platform.schedule.state`), each breaker's
  state (:mod:`jobs_platform.flow.breaker`);
- the dead-letter table, the outbox and the batches (``JOBS_DATABASE_URL``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jobs_platform import coordination
from jobs_platform.exporter import known
from jobs_platform.flow.state import declared_breakers
from jobs_platform.metrics import counters
from jobs_platform.schedule.state import SKIPPED_KEY, TICKS_KEY

#: A worker whose last report is older than this many flush intervals (plus the slack)
#: is reported down.
WORKER_LATE_INTERVALS = 3
WORKER_LATE_SLACK_S = 5.0


@dataclasses.dataclass(frozen=True)
class Sources:
    """What the collector reads, and where."""

    #: The app whose broker's queues and delayed store are read.
    app: Any
    queues: tuple[str, ...]
    redis_url: str
    database_url: str | None
    spool_key: str
    beat_ticks_key: str
    beat_skipped_key: str
    worker_late_s: float
    #: The downstreams with a circuit breaker (``jobs_breaker_state``, 0 until one opens).
    breaker_keys: tuple[str, ...] = ()
    #: Counter sample -> label values served at 0 until recorded (:mod:`.known`).
    known: dict[str, list[tuple[str, ...]]] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_app(cls, app: Any) -> Sources:
        settings = app.jobs_settings
        interval = counters.flush_interval(settings)
        return cls(
            app=app,
            queues=tuple(q.name for q in (app.conf.task_queues or ())),
            redis_url=coordination.url_of(settings),
            database_url=settings.database_url,
            spool_key=settings.dlq_spool_key,
            beat_ticks_key=TICKS_KEY,
            beat_skipped_key=SKIPPED_KEY,
            worker_late_s=WORKER_LATE_INTERVALS * interval + WORKER_LATE_SLACK_S,
            breaker_keys=tuple(declared_breakers(app)),
            known=known.label_values(app),
        )
