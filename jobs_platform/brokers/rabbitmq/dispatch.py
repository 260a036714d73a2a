"""Every publish of an app on RabbitMQ: its delay rounded up, a priority refused.

Everything a task sends goes through ``app.send_task`` (``.delay()``, retries, deferrals,
canvas, the first message of each kind in a bulk); :func:`install` wraps the app's own
``send_task`` so that

- a ``countdown``/``eta`` becomes a whole-second countdown rounded **up**
  (:mod:`.delays`): Celery's native delayed delivery would truncate it with ``int()`` (a
  retry waiting less than its policy's lower bound) and raise ``ValueError`` under 1 s;
- a ``priority`` other than 0 is refused with DispatchError: quorum queues on RabbitMQ 3.10
  have no priorities (``x-max-priority`` is refused), so it would be silently ignored;
- the broker's death record (``x-death``, ``x-first-death-*``, ``x-last-death-*``) is
  taken out of the headers. A retry copies the request's headers, and a message that came
  through a delay level carries that level in ``x-death``; delayed again through the same
  level, RabbitMQ takes it for a dead-letter cycle and never moves it on: with
  ``at-least-once`` the quorum queue keeps it for ever (counted in ``messages``, neither
  ready nor unacknowledged), so the job neither runs nor dead-letters (measured: 2-5 of 10
  jobs retried twice through a 2 s level never came back). Celery 5.7 filters these in
  ``Context.as_execution_options`` only, which ``headers=`` (the attempt history) overrides
  (celery#9867, celery#10095).

:func:`check_task_priorities` refuses a task *declared* with a priority, when the app is
finalized (a worker's start, the first dispatch).
"""

from __future__ import annotations

import functools
from typing import Any

from jobs_platform.brokers.rabbitmq import delays
from jobs_platform.brokers.rabbitmq.deadletters import BROKER_HEADERS
from jobs_platform.clock import utcnow
from jobs_platform.errors import ConfigError, DispatchError

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
        return send_task(name, args, kwargs, **delays.rounded(without_death(options), utcnow()))

    rounded_send_task.jobs_rabbitmq = True  # type: ignore[attr-defined]
    return rounded_send_task


#: The death-record headers a publish drops (``x-delivery-count`` is the broker's too).
DEATH_HEADERS = BROKER_HEADERS


def without_death(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the broker's death record out of its ``headers`` (module doc)."""
    headers = options.get("headers")
    if not isinstance(headers, dict) or DEATH_HEADERS.isdisjoint(headers):
        return options
    kept = {k: v for k, v in headers.items() if k not in DEATH_HEADERS}
    return {**options, "headers": kept}


def check_task_priorities(app: Any) -> None:
    """Refuse any task of ``app`` declared with a priority (0 is the one level)."""
    for name, task in app._tasks.items():  # not .tasks: that would finalize again
        priority = getattr(task, "priority", None)
        if priority not in (None, 0):
            raise ConfigError(f"task {name!r}: priority={priority!r} is refused: {NO_PRIORITIES}")
