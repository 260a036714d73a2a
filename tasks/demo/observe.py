"""What the tour watches while it runs: Celery's task events, and the metrics exporter.

- :class:`EventLog` follows every job through Celery's task events (on by default in
  jobs-platform): when it was sent and to which queue, each start, each retry and why, how
  it ended. The per-job report and the throughput curve come from it.
- :class:`Sampler` scrapes ``celery -A tasks metrics`` once a second: queue depths, jobs in
  flight, the outcome counters the workers keep in Redis, the delayed store, beat. The live
  table and the queue-depth curve come from it.
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time
import urllib.request
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

QUEUES = ("fast", "heavy", "thirdparty")


@dataclasses.dataclass
class Track:
    """One job (one task id) as its events told it."""

    name: str = ""
    queue: str = ""
    sent: list[float] = dataclasses.field(default_factory=list)
    received: list[float] = dataclasses.field(default_factory=list)
    started: list[float] = dataclasses.field(default_factory=list)
    retried: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    succeeded: float | None = None
    failed: float | None = None
    exception: str = ""
    hostnames: list[str] = dataclasses.field(default_factory=list)

    @property
    def final(self) -> str | None:
        if self.succeeded is not None:
            return "SUCCESS"
        if self.failed is not None:
            return "FAILURE"
        return None


class EventLog:
    """Celery task events, collected per task id in a thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._tracks: dict[str, Track] = defaultdict(Track)
        self._lock = threading.Lock()
        self._receiver: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-events", daemon=True)

    def _run(self) -> None:
        with self.app.connection_for_read() as conn:
            self._receiver = self.app.events.Receiver(conn, handlers={"*": self._on_event})
            self._ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def _on_event(self, event: dict[str, Any]) -> None:
        uuid = event.get("uuid")
        kind = str(event.get("type", ""))
        if not uuid or not kind.startswith("task-"):
            return
        at = float(event.get("timestamp") or time.time())
        with self._lock:
            track = self._tracks[uuid]
            track.name = track.name or str(event.get("name") or "")
            if kind == "task-sent":
                track.sent.append(at)
                track.queue = track.queue or str(event.get("queue") or "")
            elif kind == "task-received":
                track.received.append(at)
                track.hostnames.append(str(event.get("hostname") or ""))
            elif kind == "task-started":
                track.started.append(at)
            elif kind == "task-retried":
                track.retried.append((at, str(event.get("exception") or "")))
            elif kind == "task-succeeded":
                track.succeeded = at
            elif kind == "task-failed":
                track.failed = at
                track.exception = str(event.get("exception") or "")
            if not track.queue and event.get("hostname"):
                # Worker hostnames start with their queue ("thirdparty-1a2b3c@demo").
                track.queue = str(event["hostname"]).split("-", 1)[0]

    def snapshot(self) -> dict[str, Track]:
        with self._lock:
            return copy.deepcopy(dict(self._tracks))

    def get(self, task_id: str) -> Track:
        with self._lock:
            return copy.deepcopy(self._tracks.get(task_id, Track()))

    def sent_per_queue(self, since: float) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        with self._lock:
            for track in self._tracks.values():
                if track.sent and track.sent[0] >= since:
                    counts[track.queue] += 1
        return counts

    def __enter__(self) -> EventLog:
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("could not subscribe to Celery's task events")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(5)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One scrape of the metrics exporter (counters are the fleet's totals in Redis)."""

    t: float
    ok: bool
    waiting: dict[str, float] = dataclasses.field(default_factory=dict)
    inflight: dict[str, float] = dataclasses.field(default_factory=dict)
    succeeded: dict[str, float] = dataclasses.field(default_factory=dict)
    failed: dict[str, float] = dataclasses.field(default_factory=dict)
    retried: dict[str, float] = dataclasses.field(default_factory=dict)
    deferred: float = 0.0
    delayed: float = 0.0
    beat_sent: dict[str, float] = dataclasses.field(default_factory=dict)
    sources_up: dict[str, float] = dataclasses.field(default_factory=dict)


_BY_QUEUE = {
    "celery_queue_length": "waiting",
    "jobs_inflight": "inflight",
    "celery_task_succeeded_total": "succeeded",
    "celery_task_failed_total": "failed",
    "celery_task_retried_total": "retried",
}


def parse_sample(text: str, at: float) -> Sample:
    """A :class:`Sample` from the exporter's Prometheus text."""
    per_queue: dict[str, dict[str, float]] = {
        field: defaultdict(float) for field in _BY_QUEUE.values()
    }
    beat_sent: dict[str, float] = defaultdict(float)
    sources: dict[str, float] = {}
    deferred = delayed = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            field = _BY_QUEUE.get(s.name)
            if field is not None:
                per_queue[field][s.labels.get("queue_name", "")] += s.value
            elif s.name == "jobs_rate_deferred_total":
                deferred += s.value
            elif s.name == "jobs_delayed_depth":
                delayed = s.value
            elif s.name == "jobs_beat_sent_total":
                beat_sent[s.labels.get("entry", "")] += s.value
            elif s.name == "jobs_exporter_source_up":
                sources[s.labels.get("source", "")] = s.value
    return Sample(
        t=at,
        ok=True,
        deferred=deferred,
        delayed=delayed,
        beat_sent=dict(beat_sent),
        sources_up=sources,
        **{field: dict(values) for field, values in per_queue.items()},
    )


def scrape(url: str, timeout_s: float = 5.0) -> Sample:
    at = time.time()
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return parse_sample(response.read().decode(), at)
    except OSError:
        return Sample(t=at, ok=False)


class Sampler:
    """Scrapes the exporter every ``interval_s`` in a thread; keeps every sample."""

    def __init__(self, url: str, *, interval_s: float = 1.0) -> None:
        self.url = url
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.baseline = Sample(t=0.0, ok=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.samples.append(scrape(self.url))
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    @property
    def latest(self) -> Sample:
        for sample in reversed(self.samples):
            if sample.ok:
                return sample
        return self.baseline

    def delta(self, sample: Sample, field: str, queue: str) -> float:
        """A counter's growth since the tour started (the totals live on in Redis)."""
        now: dict[str, float] = getattr(sample, field)
        before: dict[str, float] = getattr(self.baseline, field)
        return now.get(queue, 0.0) - before.get(queue, 0.0)

    def __enter__(self) -> Sampler:
        self.baseline = scrape(self.url)
        if not self.baseline.ok:
            raise RuntimeError(f"the metrics exporter does not answer at {self.url}")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.samples.append(scrape(self.url))
