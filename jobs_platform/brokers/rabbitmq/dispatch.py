"""Every publish of an app on RabbitMQ: its delay rounded up, a priority refused.

Everything a task sends goes through ``app.send_task`` (``.delay()``, retries, deferrals,
canvas, the first message of each kind in a bulk); :func:`install` wraps the app's own
``send_task`` so that

- a ``countdown``/``eta`` becomes a whole-second countdown rounded **up**
  (:mod:`.delays`): Celery's native delayed delivery would truncate it with ``int()`` (a
  retry waiting less than its policy's lower bound) and raise ``ValueError`` under 1 s;
- a ``priority`` other than 0 is refused with DispatchError: quorum queues on RabbitMQ 3.10
  have no priorities (``x-max-priority`` is refused), so it would be silently ignored;
- the broker's ``x-death`` record (and its ``x-first-death-*``/``x-last-death-*`` summary)
  is left out of the headers: a retry or a deferral copies the delivery's headers, and a
  copy that expires again in a delay queue it already expired in is a dead-letter cycle,
  which RabbitMQ **drops without a trace** (a 1 s wait then a 3 s one lost the job: both
  pass ``celery_delayed_0``). Celery's own retry filters them too (``Context``'s
  ``_filter_x_death_headers``); the platform passes headers of its own.

:func:`check_task_priorities` refuses a task *declared* with a priority, when the app is
finalized (a worker's start, the first dispatch).
"""

from __future__ import annotations

import functools
from typing import Any

from jobs_platform.brokers.rabbitmq import delays
from jobs_platform.clock import utcnow
from jobs_platform.errors import ConfigError, DispatchError

#: What RabbitMQ writes into a message it dead-letters (delay queues' expiries included).
DEATH_HEADERS = frozenset(
    {
        "x-death",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
    }
)

NO_PRIORITIES = (
    "RabbitMQ's quorum queues serve one priority level (RabbitMQ 3.10 refuses x-max-priority): "
    "a priority would be silently ignored; send urgent work to a queue class of its own "
    "(fast) instead"
)


def install(app: Any) -> None:
    """Wrap ``app.send_task`` (the instance's, once)."""
    if getattr(app.send_task, "jobs_rabbitmq", False):
        return
    app.send_task = _wrapped(app.send_task)


def _wrapped(send_task: Any) -> Any:
    @functools.wraps(send_task)
    def rounded_send_task(name: str, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        priority = options.get("priority")
        if priority not in (None, 0):
            raise DispatchError(f"{name}: priority={priority!r} is refused: {NO_PRIORITIES}")
        return send_task(name, args, kwargs, **delays.rounded(without_deaths(options), utcnow()))

    rounded_send_task.jobs_rabbitmq = True  # type: ignore[attr-defined]
    return rounded_send_task


def without_deaths(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with no :data:`DEATH_HEADERS` in its ``headers`` (copied, not changed)."""
    headers = options.get("headers")
    if not headers or DEATH_HEADERS.isdisjoint(headers):
        return options
    kept = {k: v for k, v in headers.items() if k not in DEATH_HEADERS}
    return {**options, "headers": kept}


def check_task_priorities(app: Any) -> None:
    """Refuse any task of ``app`` declared with a priority (0 is the one level)."""
    for name, task in app._tasks.items():  # not .tasks: that would finalize again
        priority = getattr(task, "priority", None)
        if priority not in (None, 0):
            raise ConfigError(f"task {name!r}: priority={priority!r} is refused: {NO_PRIORITIES}")
