"""Every metric the exporter serves, with its type, labels and help text, in one table (pure).

Alert rules and dashboards (``ops/``) name metrics; :func:`exposed_names` is the set of
sample names the exporter can emit, so a test can refuse a rule or panel that names a
metric nobody serves. Names shared with celery-exporter keep its spelling (``celery_*``,
labels ``name``/``queue_name``); the platform's own are prefixed ``jobs_``.

``source`` says where a value comes from:

- ``recorded``: counted where it happens (a pool child, the worker's main process, beat, a
  producer that opted in) and summed in the coordination Redis (:mod:`.counters`);
- ``scrape``: read or computed by the exporter when Prometheus scrapes (:mod:`.collector`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]
Source = Literal["recorded", "scrape"]

#: Prometheus' metric and label name grammar.
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")

#: ``celery_task_runtime`` buckets (seconds): prometheus-client's defaults, then the
#: longer edges the heavy and thirdparty profiles' time limits (60 s, 600 s) need.
RUNTIME_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
    300.0,
    600.0,
    math.inf,
)


@dataclasses.dataclass(frozen=True)
class Metric:
    #: As exposed: counters end in ``_total``; a histogram's samples add
    #: ``_bucket``/``_sum``/``_count`` to it.
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    source: Source = "scrape"

    @property
    def family(self) -> str:
        """The name prometheus-client wants (a counter's without ``_total``)."""
        return self.name.removesuffix("_total") if self.kind == "counter" else self.name

    @property
    def samples(self) -> tuple[str, ...]:
        """Every sample name this metric can put in the exposition."""
        if self.kind == "histogram":
            return tuple(f"{self.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        return (self.name,)


def _recorded(name: str, kind: Kind, help_text: str, *labels: str) -> Metric:
    return Metric(name, kind, help_text, labels, "recorded")


def _scrape(name: str, help_text: str, *labels: str) -> Metric:
    return Metric(name, "gauge", help_text, labels, "scrape")


# -- counted where it happens (Celery signals in the worker, the platform's own code) ------

TASK_RECEIVED = _recorded(
    "celery_task_received_total",
    "counter",
    "Task messages a worker received (a retry or redelivery is received again).",
    "name",
    "queue_name",
)
TASK_STARTED = _recorded(
    "celery_task_started_total",
    "counter",
    "Task attempts started in a pool process.",
    "name",
    "queue_name",
)
TASK_SUCCEEDED = _recorded(
    "celery_task_succeeded_total",
    "counter",
    "Task attempts that returned.",
    "name",
    "queue_name",
)
TASK_FAILED = _recorded(
    "celery_task_failed_total",
    "counter",
    "Tasks that failed (Celery's task_failure: given up, permanent, time limit, lost "
    "worker beyond its cap, rejected), by exception class name.",
    "name",
    "queue_name",
    "exception",
)
TASK_RETRIED = _recorded(
    "celery_task_retried_total",
    "counter",
    "Task attempts that failed and were re-published for a retry.",
    "name",
    "queue_name",
)
TASK_RUNTIME = _recorded(
    "celery_task_runtime",
    "histogram",
    "Seconds from an attempt's start to its end in the pool process (any outcome).",
    "name",
    "queue_name",
)
DEAD_LETTERS = _recorded(
    "jobs_dead_letters_total",
    "counter",
    "New dead letters stored (a replayed job that dies again counts again).",
    "task",
    "queue",
    "reason",
)
DEAD_LETTER_WRITE_FAILURES = _recorded(
    "jobs_dead_letter_write_failures_total",
    "counter",
    "Dead-letter writes that failed, by stage (db, spool, lost, receiver, rejected, unreadable).",
    "stage",
)
DEAD_LETTER_SPOOLED = _recorded(
    "jobs_dead_letter_spooled_total",
    "counter",
    "Dead letters written to the durable spool.",
)
DEAD_LETTER_WEBHOOK_REQUESTS = _recorded(
    "jobs_dead_letter_webhook_requests_total",
    "counter",
    "Dead-letter webhook POSTs, by outcome (ok, error).",
    "outcome",
)
DUPLICATES_SKIPPED = _recorded(
    "jobs_duplicates_skipped_total",
    "counter",
    "Deliveries or dispatches recognised as duplicates; their side effect did not run.",
    "task",
    "guard",
)
RATE_DEFERRED = _recorded(
    "jobs_rate_deferred_total",
    "counter",
    "Jobs re-published to wait for their turn under a shared rate limit (or a pause).",
    "key",
)
CONCURRENCY_WAITED = _recorded(
    "jobs_concurrency_waited_total",
    "counter",
    "Deliveries re-published to wait for a slot of their concurrency key (no attempt spent).",
    "task",
)
DEBOUNCE_COLLAPSED = _recorded(
    "jobs_debounce_collapsed_total",
    "counter",
    "Dispatches of a debounced task folded into a run already waiting for its key.",
    "task",
)
BREAKER_DEFERRED = _recorded(
    "jobs_breaker_deferred_total",
    "counter",
    "Deliveries re-published because their downstream's circuit breaker was open or "
    "probing (no attempt spent).",
    "key",
)
BREAKER_OPENED = _recorded(
    "jobs_breaker_opened_total",
    "counter",
    "Times a downstream's circuit breaker opened (threshold reached, or its probe failed).",
    "key",
)
INTERNALS_UNAVAILABLE = _recorded(
    "jobs_internals_unavailable_total",
    "counter",
    "Worker starts at which a private Celery name the platform patches was missing; the "
    "feature fell back to Celery's own behaviour (jobs_platform/internals.py).",
    "name",
)

BEAT_SENT = _recorded(
    "jobs_beat_sent_total",
    "counter",
    "Scheduled runs sent by beat.",
    "entry",
)

# -- computed at scrape time -----------------------------------------------------------------

QUEUE_LENGTH = _scrape(
    "celery_queue_length",
    "Messages waiting in the queue (every priority sub-list), not yet fetched by a worker.",
    "queue_name",
)
QUEUE_OLDEST_AGE = _scrape(
    "jobs_queue_oldest_age_seconds",
    "Age of the oldest waiting message, from its jobs_enqueued_at stamp (0 when empty).",
    "queue_name",
)
INFLIGHT = _scrape(
    "jobs_inflight",
    "Messages fetched by a worker and not yet acknowledged (running, prefetched or held "
    "for a countdown).",
    "queue_name",
)
INFLIGHT_OLDEST_AGE = _scrape(
    "jobs_inflight_oldest_age_seconds",
    "Seconds since the oldest unacknowledged message was fetched (0 when none).",
    "queue_name",
)
WORKER_UP = _scrape(
    "celery_worker_up",
    "1 while the worker's main process reports in (every flush interval), 0 once it is "
    "late; a worker stopped cleanly disappears.",
    "hostname",
)
DEAD_LETTERS_STORED = _scrape(
    "jobs_dead_letters_stored",
    "Rows in the dead-letter table by status (dead, replayed, discarded) and reason.",
    "status",
    "reason",
)
DEAD_LETTER_NEWEST_AGE = _scrape(
    "jobs_dead_letter_newest_age_seconds",
    "Seconds since the newest dead letter's failure (no sample while the table is empty).",
)
DEAD_LETTER_SPOOL_DEPTH = _scrape(
    "jobs_dead_letter_spool_depth",
    "Entries in the dead-letter spool (list=spool: waiting for the database; rejected, "
    "unreadable: set aside for a person).",
    "list",
)
DELAYED_DEPTH = _scrape(
    "jobs_delayed_depth",
    "Jobs waiting in the delayed store for their due time.",
)
DELAYED_NEXT_DUE = _scrape(
    "jobs_delayed_next_due_timestamp_seconds",
    "Unix time the earliest delayed job is due (no sample while the store is empty).",
)
BEAT_LAST_TICK = _scrape(
    "jobs_beat_last_tick_timestamp_seconds",
    "Unix time of the beat leader's last tick that looked at each schedule entry.",
    "entry",
)
BEAT_SKIPPED = Metric(
    "jobs_beat_skipped_total",
    "counter",
    "Scheduled slots beat did not send, by reason (overlap, missed, taken); beat keeps "
    "these in Redis itself.",
    ("entry", "reason"),
    "scrape",
)
BREAKER_STATE = _scrape(
    "jobs_breaker_state",
    "Each downstream's circuit breaker: 0 closed, 1 open (its jobs deferred), 2 half-open "
    "(one probe job may run).",
    "key",
)
OUTBOX_DEPTH = _scrape(
    "jobs_outbox_depth",
    "Committed delay_on_commit jobs in job_outbox that no relay has published yet.",
)
OUTBOX_OLDEST_AGE = _scrape(
    "jobs_outbox_oldest_age_seconds",
    "Seconds since the oldest unpublished outbox job was written (0 when none waits).",
)
BATCHES_OPEN = _scrape(
    "jobs_batches_open",
    "Batches whose members have not all settled yet (on_complete not enqueued).",
)
BATCH_MEMBERS_PENDING = _scrape(
    "jobs_batch_members_pending",
    "Members of open batches that have not settled (succeeded, dead or cancelled) yet.",
)
SOURCE_UP = _scrape(
    "jobs_exporter_source_up",
    "1 if the exporter could read the source (redis, database, outbox, batches) in this "
    "scrape, else 0 "
    "(the metrics read from it are then absent).",
    "source",
)
SCRAPE_DURATION = _scrape(
    "jobs_exporter_scrape_duration_seconds",
    "Seconds this scrape spent reading Redis and the database.",
)

ALL: tuple[Metric, ...] = (
    TASK_RECEIVED,
    TASK_STARTED,
    TASK_SUCCEEDED,
    TASK_FAILED,
    TASK_RETRIED,
    TASK_RUNTIME,
    DEAD_LETTERS,
    DEAD_LETTER_WRITE_FAILURES,
    DEAD_LETTER_SPOOLED,
    DEAD_LETTER_WEBHOOK_REQUESTS,
    DUPLICATES_SKIPPED,
    RATE_DEFERRED,
    CONCURRENCY_WAITED,
    DEBOUNCE_COLLAPSED,
    BREAKER_DEFERRED,
    BREAKER_OPENED,
    INTERNALS_UNAVAILABLE,
    BEAT_SENT,
    QUEUE_LENGTH,
    QUEUE_OLDEST_AGE,
    INFLIGHT,
    INFLIGHT_OLDEST_AGE,
    WORKER_UP,
    DEAD_LETTERS_STORED,
    DEAD_LETTER_NEWEST_AGE,
    DEAD_LETTER_SPOOL_DEPTH,
    DELAYED_DEPTH,
    DELAYED_NEXT_DUE,
    BEAT_LAST_TICK,
    BEAT_SKIPPED,
    BREAKER_STATE,
    OUTBOX_DEPTH,
    OUTBOX_OLDEST_AGE,
    BATCHES_OPEN,
    BATCH_MEMBERS_PENDING,
    SOURCE_UP,
    SCRAPE_DURATION,
)
BY_NAME: dict[str, Metric] = {metric.name: metric for metric in ALL}


def exposed_names() -> frozenset[str]:
    """Every sample name the exporter may serve (what a rule or a panel may name)."""
    return frozenset(sample for metric in ALL for sample in metric.samples)


def markdown_table() -> str:
    """The table as Markdown, for ``docs/metrics.md``."""
    rows = ["| Metric | Type | Labels | Source | Meaning |", "|---|---|---|---|---|"]
    for metric in ALL:
        labels = ", ".join(f"`{label}`" for label in metric.labels) or "-"
        meaning = metric.help.replace("|", "\\|")
        rows.append(f"| `{metric.name}` | {metric.kind} | {labels} | {metric.source} | {meaning} |")
    return "\n".join(rows)
