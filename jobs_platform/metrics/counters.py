"""How counts raised in any process (pool children included) reach the exporter.

A count is a few dictionary operations in the process where it happens: :class:`Recorder`
adds it to an in-memory buffer keyed by series (sample name + label values). A daemon
thread flushes the buffer every interval (``JOBS_METRICS_FLUSH_INTERVAL``) as one
MULTI/EXEC pipeline of ``HINCRBYFLOAT`` on one hash of the coordination Redis
(:data:`~.keys.COUNTERS_KEY`); a pool child also flushes when it exits (recycled by
``--max-tasks-per-child``, or at shutdown), the worker's main process when it stops. The
exporter reads the hash with one ``HGETALL``. So the totals are the fleet's, on every
host, and survive child recycling, worker restarts and exporter restarts.

The buffer is bounded by the number of series, not of events: at 1,000 tasks per second
a flush still writes one field per (task, queue, outcome). What a crash loses is at most
one interval of the crashed process's counts (SIGKILL, OOM, power). A flush that fails
(Redis down) puts its counts back into the buffer for the next one.

Recording is off until :func:`activate` names the Redis (the worker's bootstep does, see
:mod:`.bootstep`); before that, counts stay in the process (:class:`RecordedCounter` also
keeps a prometheus-client counter, as the platform's counters always had). A forked child
starts with an empty buffer: what it inherited is the parent's to flush.
"""

from __future__ import annotations

import atexit
import bisect
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from prometheus_client import Counter

from jobs_platform.metrics import keys, names
from jobs_platform.metrics.names import Metric

logger = logging.getLogger("jobs_platform.metrics")

#: (sample name, label values): one field of the counters hash.
Series = tuple[str, tuple[str, ...]]

#: Socket timeouts of the recorder's Redis client: an exiting child waits at most this.
REDIS_TIMEOUT_S = 2.0
#: A failing flush is logged at most this often per process (it retries every interval).
ERROR_LOG_INTERVAL_S = 60.0


def flush_interval(settings: Any) -> float:
    """The flush interval of ``settings`` (seconds)."""
    return float(settings.metrics_flush_interval)


def encode_field(series: Series) -> str:
    sample, values = series
    return json.dumps([sample, *values], separators=(",", ":"))


def decode_field(field: str | bytes) -> Series | None:
    """The series of a counters-hash field, or ``None`` if it is not one of ours."""
    try:
        decoded = json.loads(field)
    except ValueError:
        return None
    if not isinstance(decoded, list) or not decoded or not all(isinstance(x, str) for x in decoded):
        return None
    return decoded[0], tuple(decoded[1:])


class Recorder:
    """One process's buffer of counts and the thread that flushes it to Redis.

    ``client`` is a redis-py client (or anything with the same ``pipeline()``). With
    :attr:`hostname` set (the worker's main process), every flush also records that the
    worker is alive (:data:`~.keys.WORKERS_KEY`), even when nothing was counted.
    """

    def __init__(
        self,
        client: Any,
        *,
        interval_s: float,
        key: str = keys.COUNTERS_KEY,
        workers_key: str = keys.WORKERS_KEY,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"the flush interval must be > 0 s, got {interval_s}")
        self.client = client
        self.interval_s = interval_s
        self.key = key
        self.workers_key = workers_key
        self.clock = clock
        self.hostname: str | None = None
        self._pending: dict[Series, float] = {}
        self._lock = threading.Lock()  # guards _pending: taken on every count
        self._flush_lock = threading.Lock()  # one flush at a time (thread vs exit)
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error_log = -math.inf

    # -- counting (the per-task path: keep it to dictionary operations) ----------------------

    def add(self, series: Series, amount: float = 1.0) -> None:
        with self._lock:
            self._pending[series] = self._pending.get(series, 0.0) + amount
        if self._thread is None:
            self.start()

    def add_many(self, items: Iterable[tuple[Series, float]]) -> None:
        with self._lock:
            pending = self._pending
            for series, amount in items:
                pending[series] = pending.get(series, 0.0) + amount
        if self._thread is None:
            self.start()

    def pending(self) -> dict[Series, float]:
        """A copy of what the next flush would write."""
        with self._lock:
            return dict(self._pending)

    # -- flushing ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the flush thread (once; counting starts it by itself)."""
        with self._start_lock:
            if self._thread is not None or self._stop.is_set():
                return
            self._thread = threading.Thread(
                target=self._run, name="jobs-metrics-flush", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> bool:
        """Write the buffer (and the heartbeat) in one transaction; whether it succeeded.

        On failure the counts go back into the buffer, so nothing is lost while Redis is
        away; the error is logged at most every :data:`ERROR_LOG_INTERVAL_S`.
        """
        with self._flush_lock:
            with self._lock:
                batch, self._pending = self._pending, {}
            if not batch and self.hostname is None:
                return True
            try:
                pipe = self.client.pipeline(transaction=True)
                for series, amount in batch.items():
                    pipe.hincrbyfloat(self.key, encode_field(series), amount)
                if self.hostname is not None:
                    pipe.hset(self.workers_key, self.hostname, repr(self.clock()))
                pipe.execute()
            except Exception as exc:
                self._put_back(batch)
                self._report(exc, len(batch))
                return False
            return True

    def _put_back(self, batch: dict[Series, float]) -> None:
        with self._lock:
            for series, amount in batch.items():
                self._pending[series] = self._pending.get(series, 0.0) + amount

    def _report(self, exc: BaseException, series: int) -> None:
        now = time.monotonic()
        if now - self._last_error_log < ERROR_LOG_INTERVAL_S:
            return
        self._last_error_log = now
        logger.warning(
            "jobs.metrics.flush_failed: %d series kept in memory for the next flush: %s",
            series,
            exc,
            extra={"event": "jobs.metrics.flush_failed"},
        )

    def close(self, *, farewell: bool = False) -> bool:
        """Stop the thread and flush what is left; with ``farewell`` also remove this
        worker from the live list (a clean stop is not an outage). Whether the flush
        succeeded."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self.interval_s + 2 * REDIS_TIMEOUT_S)
        flushed = self.flush()
        hostname, self.hostname = self.hostname, None  # a later flush (atexit) is no heartbeat
        if farewell and hostname is not None:
            try:
                self.client.hdel(self.workers_key, hostname)
            except Exception as exc:
                self._report(exc, 0)
        return flushed


# -- this process's recorder -------------------------------------------------------------------

_target: tuple[str, float, Any] | None = None  # (Redis URL, flush interval, client or None)
_recorder: Recorder | None = None
_recorder_lock = threading.Lock()


def activate(url: str, *, interval_s: float, client: Any = None) -> None:
    """Record this process's counts (and those of processes forked from it) into the
    Redis at ``url``, flushed every ``interval_s`` seconds (through ``client`` if given,
    else a client of this process's own). A recorder for another target is flushed and
    replaced."""
    global _target, _recorder
    if interval_s <= 0:
        raise ValueError(f"the flush interval must be > 0 s, got {interval_s}")
    target = (url, interval_s, client)
    with _recorder_lock:
        if target == _target:
            return
        old, _recorder, _target = _recorder, None, target
    if old is not None:
        old.close()


def deactivate(*, farewell: bool = False) -> bool:
    """Flush and stop this process's recorder (``farewell``: see :meth:`Recorder.close`);
    later counts stay in the process. Whether the last flush succeeded."""
    global _target, _recorder
    with _recorder_lock:
        recorder, _recorder, _target = _recorder, None, None
    return True if recorder is None else recorder.close(farewell=farewell)


def active() -> bool:
    return _target is not None


def current() -> Recorder | None:
    """This process's recorder (built on first use), or ``None`` if recording is off."""
    global _recorder
    recorder = _recorder
    if recorder is not None or _target is None:
        return recorder
    with _recorder_lock:
        if _recorder is None and _target is not None:
            url, interval_s, client = _target
            if client is None:
                from jobs_platform import redis_urls

                client = redis_urls.client(
                    url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
                )
            _recorder = Recorder(client, interval_s=interval_s)
        return _recorder


def record(series: Series, amount: float = 1.0) -> None:
    """Count ``amount`` for ``series`` (a no-op while recording is off)."""
    recorder = _recorder or current()
    if recorder is not None:
        recorder.add(series, amount)


#: The bucket edges as the exposition spells them (``0.005``, ``1.0``, ``+Inf``).
BUCKET_LABELS = tuple("+Inf" if math.isinf(e) else repr(float(e)) for e in names.RUNTIME_BUCKETS)


def observe(metric: Metric, values: tuple[str, ...], seconds: float) -> None:
    """One observation of a histogram: its bucket (non-cumulative), its sum and count."""
    recorder = _recorder or current()
    if recorder is None:
        return
    edge = BUCKET_LABELS[bisect.bisect_left(names.RUNTIME_BUCKETS, seconds)]
    recorder.add_many(
        (
            ((f"{metric.name}_bucket", (*values, edge)), 1.0),
            ((f"{metric.name}_sum", values), seconds),
            ((f"{metric.name}_count", values), 1.0),
        )
    )


def flush() -> bool:
    """Flush this process's recorder now (a child about to exit, a test)."""
    recorder = _recorder
    return True if recorder is None else recorder.flush()


def _forget_in_child() -> None:
    # The inherited buffer holds the parent's counts (the parent flushes them) and its
    # thread does not exist here; the lock may have been held by that thread at fork.
    global _recorder, _recorder_lock
    _recorder = None
    _recorder_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
# Ordinary processes (a producer that activated recording, a solo worker's last counts);
# pool children leave with os._exit and flush in worker_process_shutdown instead.
atexit.register(flush)


# -- prometheus-client-shaped counters for the platform's own code -----------------------------


class RecordedChild:
    """One labelled series: ``inc()`` counts locally and for the exporter."""

    def __init__(self, metric: Metric, values: tuple[str, ...], local: Any) -> None:
        self.series: Series = (metric.name, values)
        self._local = local
        self._count = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self._local.inc(amount)  # refuses a negative amount before anything is recorded
        self._count += amount
        record(self.series, amount)

    def value(self) -> float:
        """What this process counted (the fleet's total is the exporter's)."""
        return self._count


class RecordedCounter:
    """A counter with prometheus-client's ``labels(...).inc()`` interface whose counts are
    also recorded for the exporter. The process-local prometheus-client counter stays
    registered (in-process readers such as tests keep working)."""

    def __init__(self, metric: Metric) -> None:
        if metric.kind != "counter":
            raise ValueError(f"{metric.name} is a {metric.kind}, not a counter")
        self.metric = metric
        self._local = Counter(metric.family, metric.help, list(metric.labels))
        self._children: dict[tuple[str, ...], RecordedChild] = {}
        self._lock = threading.Lock()

    def labels(self, *values: object, **by_name: object) -> RecordedChild:
        key = self._label_values(values, by_name)
        child = self._children.get(key)
        if child is None:
            with self._lock:
                child = self._children.get(key)
                if child is None:
                    local = self._local.labels(*key) if key else self._local
                    child = RecordedChild(self.metric, key, local)
                    self._children[key] = child
        return child

    def inc(self, amount: float = 1.0) -> None:
        """For a counter without labels."""
        self.labels().inc(amount)

    def _label_values(
        self, values: Sequence[object], by_name: dict[str, object]
    ) -> tuple[str, ...]:
        wanted = self.metric.labels
        if values and by_name:
            raise ValueError(f"{self.metric.name}: label values by position or by name, not both")
        if by_name:
            if set(by_name) != set(wanted):
                raise ValueError(f"{self.metric.name}: labels are {wanted}, got {sorted(by_name)}")
            values = [by_name[name] for name in wanted]
        if len(values) != len(wanted):
            raise ValueError(f"{self.metric.name}: labels are {wanted}, got {len(values)} value(s)")
        return tuple(str(value) for value in values)
