"""Publishing a bulk: one pooled connection, one write per chunk, and an exact account of
what went out when the broker fails.

Calls go out in chunks of :data:`CHUNK`, each chunk's messages (and their task-sent
events) written together through the broker's publish session (on Redis one pipeline:
``LPUSH`` onto the queue, or the delayed store's script for a long delay), executed once
and never retried, so each message is written at most once. When
the broker fails, the chunks executed before are enqueued, the chunk being executed is
*uncertain* (each of its messages is queued once or not at all: Redis ran the commands it
had read) and the rest were not sent. The :class:`~.calls.BulkDispatchError` lists each.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jobs_platform import brokers, dispatch
from jobs_platform.brokers.interface import PublishSession
from jobs_platform.bulk import claims
from jobs_platform.bulk.calls import BulkDispatchError, Call
from jobs_platform.bulk.messages import Messages, Recorder
from jobs_platform.clock import utc_iso
from jobs_platform.urls import masked

#: Calls per pipeline: ~1 MB of commands for small jobs, one round trip each.
CHUNK = 500


@dataclasses.dataclass
class Progress:
    """How far the publishing got, in calls of the list being published."""

    enqueued: int = 0  # known to be in the broker
    writing: int = 0  # written, reply not read (uncertain if the broker fails now)


def publish(task: Any, calls: list[Call], results: list[Any]) -> None:
    """Publish ``calls`` in order, putting each one's AsyncResult in ``results``."""
    todo: list[Call] = []
    progress = Progress()
    broker = brokers.of(task.app)
    try:
        with task.app.producer_or_acquire() as producer:
            _connect(task, producer.connection)
            channel = producer.channel
            broker.reach(task.app, channel)
            held = claims.claim(task, calls)
            for index, holder in held.items():
                results[index] = task.AsyncResult(holder)
            todo = [call for call in calls if call.index not in held]
            _publish_chunks(task, broker.publish_session(channel), todo, results, progress)
    except Exception as exc:
        raise _failure(task, calls, todo, results, progress, exc) from exc


def _connect(task: Any, connection: Any) -> None:
    """Connect as a single publish does: Celery's publish retry policy, within
    ``JOBS_DISPATCH_TIMEOUT``. (Left to the channel, kombu retries the connection with its own
    defaults: 2, then 4 s apart, 6 s in all for a 5-s setting.)"""
    policy = task.app.conf.task_publish_retry_policy or {}
    connection.ensure_connection(
        max_retries=policy.get("max_retries", 2),
        interval_start=policy.get("interval_start", 0),
        interval_step=policy.get("interval_step", 0.2),
        interval_max=policy.get("interval_max", 0.2),
        timeout=task.app.jobs_settings.dispatch_timeout,
    )


def _publish_chunks(
    task: Any, sink: PublishSession, todo: list[Call], results: list[Any], progress: Progress
) -> None:
    recorder = Recorder(sink.channel, sink, events_exchange=task.app.conf.event_exchange)
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
            claims.confirm(task, part)  # out: their locks now live unique_for
        ok = True
    finally:
        sink.close(discard=not ok)


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
    skipped = len(calls) - len(todo)
    already = f", {skipped} already queued (unique_for)" if skipped else ""
    broker_down = dispatch.broker_down(brokers.of(task.app), exc)
    if broker_down and not enqueued and not uncertain:
        # Nothing went out: the words a single .delay() gets from a broker that did not answer.
        message = str(dispatch.broker_unreachable(task, exc)) + already
    else:
        if broker_down:
            cause = f"the broker at {masked(task.app.jobs_settings.broker_url)} failed: "
            cause += dispatch.root_message(exc)
        else:
            cause = f"{type(exc).__name__}: {exc}"
        message = (
            f"{task.name}: bulk dispatch of {len(calls)} calls failed after {len(enqueued)} "
            f"were enqueued; {len(uncertain)} uncertain (each queued once or not at all), "
            f"{len(unsent_calls)} not sent{already}: {cause}"
        )
    return BulkDispatchError(
        message,
        enqueued=enqueued,
        uncertain=uncertain,
        unsent=[c.index for c in unsent_calls],
        results=results,
    )
