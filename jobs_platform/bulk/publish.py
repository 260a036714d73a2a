"""Publishing a bulk: one pooled connection, one pipeline per chunk, and an exact account of
what went out when the broker fails.

Calls go out in chunks of :data:`CHUNK`, each chunk's commands (``LPUSH`` onto the queue,
or the delayed store's script for a long delay, and the task-sent events) in one Redis
pipeline, executed once and never retried, so each message is written at most once. When
the broker fails, the chunks executed before are enqueued, the chunk being executed is
*uncertain* (each of its messages is queued once or not at all: Redis ran the commands it
had read) and the rest were not sent. The :class:`~.calls.BulkDispatchError` lists each.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from kombu.utils.functional import retry_over_time

from jobs_platform import dispatch
from jobs_platform.bulk import claims
from jobs_platform.bulk.calls import BulkDispatchError, Call
from jobs_platform.bulk.messages import Messages, Recorder
from jobs_platform.clock import utc_iso
from jobs_platform.urls import masked

#: Calls per pipeline: ~1 MB of commands for small jobs, one round trip each.
CHUNK = 500


class Sink:
    """Where messages go: kombu's Redis publish batch (a pipeline per :meth:`flush`), or,
    on a channel that cannot batch safely (retries configured, another transport), one
    publish at a time."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        batchable = getattr(channel, "supports_batch_publish", False)
        create = getattr(channel, "create_publish_batch", None)
        self.session = create(max_size=sys.maxsize) if batchable and create else None

    @property
    def pipelined(self) -> bool:
        return self.session is not None

    def publish(self, message: dict[str, Any], **options: Any) -> None:
        if self.session is None:
            self.channel.basic_publish(message, **options)
        else:
            self.session.publish(message, **options)

    def flush(self) -> None:
        if self.session is not None:
            self.session.flush()

    def close(self, *, discard: bool) -> None:
        if self.session is not None:
            if discard:
                self.session.discard()
            self.session.close()


@dataclasses.dataclass
class Progress:
    """How far the publishing got, in calls of the list being published."""

    enqueued: int = 0  # known to be in the broker
    writing: int = 0  # written, reply not read (uncertain if the broker fails now)


def publish(task: Any, calls: list[Call], results: list[Any]) -> None:
    """Publish ``calls`` in order, putting each one's AsyncResult in ``results``."""
    todo: list[Call] = []
    progress = Progress()
    try:
        with task.app.producer_or_acquire() as producer:
            channel = producer.channel
            _ping(task.app, channel)
            held = claims.claim(task, calls)
            for index, holder in held.items():
                results[index] = task.AsyncResult(holder)
            todo = [call for call in calls if call.index not in held]
            _publish_chunks(task, channel, todo, results, progress)
    except Exception as exc:
        raise _failure(task, calls, todo, results, progress, exc) from exc


def _publish_chunks(
    task: Any, channel: Any, todo: list[Call], results: list[Any], progress: Progress
) -> None:
    sink = Sink(channel)
    recorder = Recorder(channel, sink, events_exchange=task.app.conf.event_exchange)
    messages = Messages(task, recorder)
    ok = False
    try:
        for start in range(0, len(todo), CHUNK):
            part = todo[start : start + CHUNK]
            stamp = utc_iso()  # one enqueue stamp per chunk: its calls go out together
            for call in part:
                if not sink.pipelined:
                    progress.writing = 1
                results[call.index] = messages.publish(call, stamp)
                if not sink.pipelined:
                    progress.enqueued, progress.writing = progress.enqueued + 1, 0
            recorder.send_events()
            if sink.pipelined:
                progress.writing = len(part)
                sink.flush()
                progress.enqueued, progress.writing = progress.enqueued + len(part), 0
        ok = True
    finally:
        sink.close(discard=not ok)


def _ping(app: Any, channel: Any) -> None:
    """Reach the broker before anything is written, retried as a single publish is: a
    broker down at the start fails the bulk with nothing sent (and heals a pooled
    connection that went stale)."""
    acquire = getattr(channel, "conn_or_acquire", None)
    if acquire is None:
        return  # not Redis (memory:// in unit tests): nothing to reach

    def ping() -> None:
        with acquire() as client:
            client.ping()

    policy = app.conf.task_publish_retry_policy or {}
    errors = (
        ConnectionError,
        TimeoutError,
        OSError,
        *getattr(channel.connection, "connection_errors", ()),
    )
    retry_over_time(
        ping,
        errors,
        max_retries=policy.get("max_retries", 2),
        interval_start=policy.get("interval_start", 0),
        interval_step=policy.get("interval_step", 0.2),
        interval_max=policy.get("interval_max", 0.2),
    )


def _failure(
    task: Any,
    calls: list[Call],
    todo: list[Call],
    results: list[Any],
    progress: Progress,
    exc: Exception,
) -> BulkDispatchError:
    """The error for a bulk that failed after its checks, with what went out."""
    if not todo:  # failed before publishing began (broker down, lock round trip)
        todo = [call for call in calls if results[call.index] is None]
    done = progress.enqueued
    enqueued = [c.index for c in todo[:done]]
    uncertain = [c.index for c in todo[done : done + progress.writing]]
    unsent_calls = todo[done + progress.writing :]
    for call in unsent_calls:
        results[call.index] = None
    claims.release(task, todo[done:])  # as dispatch_once frees its lock when a publish fails
    if dispatch.caused_by_connection_error(exc):
        cause = f"the broker at {masked(task.app.jobs_settings.broker_url)} failed: "
        cause += dispatch.root_message(exc)
    else:
        cause = f"{type(exc).__name__}: {exc}"
    skipped = len(calls) - len(todo)
    return BulkDispatchError(
        f"{task.name}: bulk dispatch of {len(calls)} calls failed after {len(enqueued)} were "
        f"enqueued; {len(uncertain)} uncertain (each queued once or not at all), "
        f"{len(unsent_calls)} not sent"
        + (f", {skipped} already queued (unique_for)" if skipped else "")
        + f": {cause}",
        enqueued=enqueued,
        uncertain=uncertain,
        unsent=[c.index for c in unsent_calls],
        results=results,
    )
