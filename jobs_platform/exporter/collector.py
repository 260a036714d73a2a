"""The exporter's collector: every value read from the broker, the coordination Redis and
the database when Prometheus scrapes, at a cost that does not grow with the backlog.

Per scrape:

- the broker (:meth:`~jobs_platform.brokers.interface.Broker.queue_states`, ``inflight``
  and its delayed store; on Redis 4 round trips: 2 commands per priority sub-list; ``HLEN``,
  ``ZRANGE``, ``HMGET`` of at most ``INFLIGHT_SCAN_LIMIT`` entries; ``ZCARD`` and
  ``ZRANGE 0 0 WITHSCORES`` of the store);
- Redis, one pipeline: the counters hash (``HGETALL``, one field per series), the
  live-workers hash, the spool lists (``LLEN``) and beat's ticks (``HGETALL``); then one
  ``HGET`` per declared circuit breaker (``jobs_breaker_state``);
- the database, one query: ``SELECT status, reason, count(*), max(failed_at) ... GROUP BY
  status, reason`` over the dead-letter table, and one over the outbox's unpublished rows
  (``count(*), min(created_at)``, through its partial index; source ``outbox``), and one over
  the open batches (``count(*), sum(pending)``; source ``batches``).

A source that fails (Redis or the database down, the table not created yet) does not fail
the scrape: its metrics are left out, ``jobs_exporter_source_up{source}`` says 0 and the
error is logged, so an alert can tell "no dead letters" from "cannot see them".
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from jobs_platform import brokers
from jobs_platform.batches.state import open_batches
from jobs_platform.clock import as_utc, unix_time
from jobs_platform.coordination.lease import text
from jobs_platform.db import engine_for
from jobs_platform.deadletter.model import REASONS, STATUSES
from jobs_platform.deadletter.store import TABLE
from jobs_platform.exporter.sources import Sources
from jobs_platform.flow import breaker
from jobs_platform.metrics import counters, keys, names
from jobs_platform.outbox.upkeep import backlog

logger = logging.getLogger("jobs_platform.metrics")

#: A worker silent for this long is no longer reported at all (and dropped from Redis):
#: hostnames change with every container, the list must not grow forever.
WORKER_RETENTION_S = 3600.0
#: A failing source is logged when it starts failing, then at most this often.
ERROR_LOG_INTERVAL_S = 300.0

_BUCKET_EDGES = counters.BUCKET_LABELS


class JobsCollector(Collector):
    def __init__(
        self,
        sources: Sources,
        *,
        clock: Callable[[], float] = time.time,
        redis_client: Any = None,
    ) -> None:
        self.sources = sources
        self.clock = clock
        self._client = redis_client
        self._last_error_log: dict[str, float] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            from jobs_platform import redis_urls

            self._client = redis_urls.client(
                self.sources.redis_url, socket_timeout=5, socket_connect_timeout=5
            )
        return self._client

    def describe(self) -> list[Metric]:
        return []  # nothing to read at registration

    def collect(self) -> Iterator[Metric]:
        began = time.perf_counter()
        now = self.clock()
        families: list[Metric] = []
        up = {
            "redis": self._guarded("redis", lambda: families.extend(self._from_redis(now))),
            "database": self._guarded(
                "database", lambda: families.extend(self._from_database(now))
            ),
            "outbox": self._guarded("outbox", lambda: families.extend(self._from_outbox(now))),
            "batches": self._guarded("batches", lambda: families.extend(self._from_batches())),
        }
        yield from families
        source_up = _gauge(names.SOURCE_UP)
        for source, ok in up.items():
            source_up.add_metric([source], 1.0 if ok else 0.0)
        yield source_up
        duration = _gauge(names.SCRAPE_DURATION)
        duration.add_metric([], time.perf_counter() - began)
        yield duration

    def _guarded(self, source: str, read: Callable[[], None]) -> bool:
        if source in ("database", "outbox", "batches") and not self.sources.database_url:
            return False
        try:
            read()
        except Exception as exc:
            # Once when it starts failing, then every ERROR_LOG_INTERVAL_S, not every scrape.
            now = time.monotonic()
            if now - self._last_error_log.get(source, -math.inf) >= ERROR_LOG_INTERVAL_S:
                self._last_error_log[source] = now
                logger.warning(
                    "jobs.metrics.source_failed: could not read %s: %s",
                    source,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    extra={"event": "jobs.metrics.source_failed"},
                )
            return False
        self._last_error_log.pop(source, None)
        return True

    # -- Redis ---------------------------------------------------------------------------

    def _from_redis(self, now: float) -> list[Metric]:
        src = self.sources
        client = self.client
        families = self._queue_families(now)
        pipe = client.pipeline(transaction=False)
        pipe.hgetall(keys.COUNTERS_KEY)
        pipe.hgetall(keys.WORKERS_KEY)
        spool_lists = {
            "spool": src.spool_key,
            "rejected": f"{src.spool_key}:rejected",
            "unreadable": f"{src.spool_key}:unreadable",
        }
        for key in spool_lists.values():
            pipe.llen(key)
        pipe.hgetall(src.beat_ticks_key)
        pipe.hgetall(src.beat_skipped_key)
        replies = pipe.execute()
        recorded, seen, *depths, ticks, skipped = replies
        families.extend(counter_families(recorded, src.known))
        families.append(self._workers(client, seen, now))
        spool = _gauge(names.DEAD_LETTER_SPOOL_DEPTH)
        for label, depth in zip(spool_lists, depths, strict=True):
            spool.add_metric([label], float(depth))
        families.append(spool)
        store = brokers.of(src.app).delayed_store(src.app)
        if store is not None:
            delayed, due = store.next_due_s()
            families.append(_gauge(names.DELAYED_DEPTH, float(delayed)))
            families.append(_gauge(names.DELAYED_NEXT_DUE, due))  # no sample when empty
        families.append(_beat_ticks(ticks))
        families.append(_beat_skipped(skipped))
        families.append(_breaker_states(client, src.breaker_keys))
        return families

    def _queue_families(self, now: float) -> list[Metric]:
        src = self.sources
        broker = brokers.of(src.app)
        length, oldest = _gauge(names.QUEUE_LENGTH), _gauge(names.QUEUE_OLDEST_AGE)
        for queue, state in broker.queue_states(src.app, src.queues).items():
            length.add_metric([queue], float(state.length))
            if state.length == 0:
                oldest.add_metric([queue], 0.0)
            elif state.oldest_enqueued_at is not None:
                oldest.add_metric([queue], max(0.0, now - state.oldest_enqueued_at))
        inflight = broker.inflight(src.app)
        if inflight is None:  # the broker cannot tell
            return [length, oldest]
        count, age = _gauge(names.INFLIGHT), _gauge(names.INFLIGHT_OLDEST_AGE)
        for queue, n in inflight.by_queue.items():
            count.add_metric([queue], float(n))
            if queue in src.queues or queue in inflight.oldest_fetched_at:
                fetched = inflight.oldest_fetched_at.get(queue)
                age.add_metric([queue], 0.0 if fetched is None else max(0.0, now - fetched))
        return [length, oldest, count, age]

    def _workers(self, client: Any, seen: dict[bytes, bytes], now: float) -> Metric:
        up = _gauge(names.WORKER_UP)
        gone = []
        for raw_host, raw_at in seen.items():
            host = raw_host.decode(errors="replace")
            try:
                silent = now - float(raw_at)
            except ValueError:
                silent = math.inf
            if silent > WORKER_RETENTION_S:
                gone.append(raw_host)
                continue
            up.add_metric([host], 1.0 if silent <= self.sources.worker_late_s else 0.0)
        if gone:
            client.hdel(keys.WORKERS_KEY, *gone)
        return up

    # -- the database ----------------------------------------------------------------------

    def _from_database(self, now: float) -> list[Metric]:
        assert self.sources.database_url is not None
        c = TABLE.c
        query = sa.select(c.status, c.reason, sa.func.count(), sa.func.max(c.failed_at)).group_by(
            c.status, c.reason
        )
        with engine_for(self.sources.database_url).connect() as conn:
            rows = conn.execute(query).all()
        counts = {(status, reason): 0 for status in STATUSES for reason in REASONS}
        newest = None
        for status, reason, count, failed_at in rows:
            counts[(status, reason)] = int(count)
            if failed_at is not None:
                at = as_utc(failed_at).timestamp()
                newest = at if newest is None else max(newest, at)
        stored = _gauge(names.DEAD_LETTERS_STORED)
        for (status, reason), count in counts.items():
            stored.add_metric([status, reason], float(count))
        age = None if newest is None else max(0.0, now - newest)
        return [stored, _gauge(names.DEAD_LETTER_NEWEST_AGE, age)]  # no sample when empty

    def _from_outbox(self, now: float) -> list[Metric]:
        """The outbox's backlog, apart from the dead letters: a database migrated before
        the outbox existed still serves its dead-letter metrics."""
        assert self.sources.database_url is not None
        with engine_for(self.sources.database_url).connect() as conn:
            waiting = backlog(conn, dt.datetime.fromtimestamp(now, dt.UTC))
        return [
            _gauge(names.OUTBOX_DEPTH, float(waiting.depth)),
            _gauge(names.OUTBOX_OLDEST_AGE, waiting.oldest_age_s),
        ]

    def _from_batches(self) -> list[Metric]:
        """Open batches and their pending members (one query over the unsettled rows)."""
        assert self.sources.database_url is not None
        with engine_for(self.sources.database_url).connect() as conn:
            found = open_batches(conn)
        return [
            _gauge(names.BATCHES_OPEN, float(found.batches)),
            _gauge(names.BATCH_MEMBERS_PENDING, float(found.pending)),
        ]


def _gauge(metric: names.Metric, value: float | None = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(metric.name, metric.help, labels=metric.labels)
    if value is not None:
        family.add_metric([], value)
    return family


def _beat_ticks(ticks: dict[bytes, bytes]) -> Metric:
    family = _gauge(names.BEAT_LAST_TICK)
    for entry, at in ticks.items():
        stamp = unix_time(at.decode(errors="replace"))
        if stamp is not None:
            family.add_metric([entry.decode(errors="replace")], stamp)
    return family


def _beat_skipped(skipped: dict[bytes, bytes]) -> Metric:
    metric = names.BEAT_SKIPPED
    family = CounterMetricFamily(metric.family, metric.help, labels=metric.labels)
    for field, count in sorted(skipped.items()):
        reason, _, entry = field.decode(errors="replace").partition(":")
        if entry:
            family.add_metric([entry, reason], float(count))
    return family


def _breaker_states(client: Any, keys: tuple[str, ...]) -> Metric:
    """Each declared breaker's state: one HGET per key (an unknown key is closed)."""
    family = _gauge(names.BREAKER_STATE)
    if not keys:
        return family
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.hget(breaker.state_key(key), "state")
    for key, state in zip(keys, pipe.execute(), strict=True):
        name = "closed" if state is None else text(state)
        family.add_metric([key], float(breaker.STATE_VALUES.get(name, 0)))
    return family


def counter_families(
    recorded: dict[bytes, bytes], known: Mapping[str, list[tuple[str, ...]]] | None = None
) -> list[Metric]:
    """The worker-side metrics from the counters hash (fields of unknown series ignored);
    each ``known`` series not recorded yet is served at 0."""
    values: dict[str, dict[tuple[str, ...], float]] = {}
    for field, raw in recorded.items():
        decoded = counters.decode_field(field)
        if decoded is not None:
            sample, labels = decoded
            values.setdefault(sample, {})[labels] = float(raw)
    families: list[Metric] = []
    for metric in names.ALL:
        if metric.source != "recorded":
            continue
        if metric.kind == "counter":
            family = CounterMetricFamily(metric.family, metric.help, labels=metric.labels)
            series = dict(values.get(metric.name, {}))
            for labels in (known or {}).get(metric.name, ()):
                series.setdefault(labels, 0.0)
            if not series and not metric.labels:
                series = {(): 0.0}
            for labels, value in sorted(series.items()):
                if len(labels) == len(metric.labels):
                    family.add_metric(list(labels), value)
            families.append(family)
        elif metric.kind == "histogram":
            families.append(_histogram(metric, values))
    return families


def _histogram(metric: names.Metric, values: dict[str, dict[tuple[str, ...], float]]) -> Metric:
    """Cumulative buckets from the recorded per-bucket counts."""
    family = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
    width = len(metric.labels)
    buckets: dict[tuple[str, ...], list[float]] = {}
    for labels, count in values.get(f"{metric.name}_bucket", {}).items():
        if len(labels) != width + 1 or labels[-1] not in _BUCKET_EDGES:
            continue
        per_edge = buckets.setdefault(labels[:-1], [0.0] * len(_BUCKET_EDGES))
        per_edge[_BUCKET_EDGES.index(labels[-1])] += count
    sums = values.get(f"{metric.name}_sum", {})
    for labels, per_edge in sorted(buckets.items()):
        running, cumulative = 0.0, []
        for edge, count in zip(_BUCKET_EDGES, per_edge, strict=True):
            running += count
            cumulative.append((edge, running))
        family.add_metric(list(labels), cumulative, sum_value=sums.get(labels, 0.0))
    return family
