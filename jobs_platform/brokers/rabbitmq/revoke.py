"""Revoke reaching a job that waits in RabbitMQ's delayed-delivery queues.

A delayed job waits in ``celery_delayed_N``, in no worker: Celery's revoke (a broadcast to
the workers up now, kept in their memory) misses a worker started later, and a restarted
worker forgets it. So :class:`Control` first records the id on the coordination Redis
(``jobs:revoked:<id>``, kept :func:`keep_s` seconds: the longest delay plus the consumer
timeout, so it outlives any wait), then broadcasts as Celery does. When a delayed message
(one with an ETA) reaches a worker, :func:`on_received` looks its id up (one ``EXISTS``, in
the consumer, only for delayed messages) and marks it revoked in the worker's own revoked
set, exactly as Celery's ``revoke`` command does; Celery then skips it, acknowledges it,
stores REVOKED and fires ``task_revoked``. A job already running is Celery's business, as
on Redis. If the coordination Redis does not answer, the job runs (logged): a revoke is a
request, losing a job is not an option.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.app.control import Control as CeleryControl

from jobs_platform import coordination

logger = logging.getLogger("jobs_platform.delayed")

KEY_PREFIX = "jobs:revoked:"


def key_of(task_id: str) -> str:
    return f"{KEY_PREFIX}{task_id}"


def keep_s(settings: Any) -> int:
    """How long a revoked id is kept: any delay (JOBS_MAX_DELAY) plus a held delivery."""
    return int(settings.max_delay + settings.rabbitmq_consumer_timeout) + 60


def record(app: Any, task_ids: list[str]) -> None:
    client = coordination.client(app)
    ttl = keep_s(app.jobs_settings)
    with client.pipeline(transaction=False) as pipe:
        for task_id in task_ids:
            pipe.set(key_of(task_id), "1", ex=ttl)
        pipe.execute()


class Control(CeleryControl):  # type: ignore[misc]
    """Celery's ``app.control`` whose :meth:`revoke` also reaches delayed jobs."""

    def revoke(self, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        ids = [task_id] if isinstance(task_id, str) else [str(one) for one in task_id]
        record(self.app, ids)
        logger.info(
            "jobs.delayed.revoked: %s recorded for delayed delivery",
            ", ".join(ids),
            extra={"event": "jobs.delayed.revoked", "task_ids": ids},
        )
        return super().revoke(task_id, *args, **kwargs)


def mark_if_revoked(app: Any, request: Any) -> None:
    """A delayed message whose id was revoked is marked revoked in this worker (module doc)."""
    try:
        revoked = bool(coordination.client(app).exists(key_of(request.id)))
    except Exception as exc:  # the coordination Redis is down: run it, and say so
        logger.warning(
            "jobs.delayed.revoke_unknown: %s[%s] runs: the revoked ids on the coordination "
            "Redis could not be read: %s",
            request.name,
            request.id,
            exc,
            extra={"event": "jobs.delayed.revoke_unknown", "task_id": request.id},
        )
        return
    if revoked:
        from celery.worker import state as worker_state  # a worker's, imported in one

        worker_state.revoked.add(request.id)
