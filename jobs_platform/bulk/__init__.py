"""Bulk dispatch: many calls of one task, checked together, published through one connection.

::

    calls.py     read and check every call first (all or nothing)        (pure)
    claims.py    unique-dispatch locks for the whole bulk, one round trip  (Redis)
    messages.py  Celery builds the first message of each kind, the rest
                 are copies with their own id, arguments and ETA           (Celery)
    publish.py   one pooled connection, a pipeline per chunk, and what
                 went out when the broker fails                           (kombu)

``task.delay_many(calls)`` is ``[task.delay(*c) for c in calls]`` and
``task.apply_async_many(calls, **options)`` is ``[task.apply_async(a, k, **options) ...]``:
the same checks, routing, enqueue stamp, unique dispatch, delays (a long one goes to the
delayed store) and task-sent events, with the same messages, in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobs_platform.bulk import publish as publishing
from jobs_platform.bulk.calls import BulkDispatchError, read

__all__ = ["BulkDispatchError", "apply_async_many", "delay_many"]


def delay_many(task: Any, calls: Iterable[Any]) -> list[Any]:
    """Each call is a tuple of positional arguments or a dict of keyword arguments."""
    return _dispatch(task, calls, {}, form="delay")


def apply_async_many(task: Any, calls: Iterable[Any], options: dict[str, Any]) -> list[Any]:
    """Each call is an ``(args, kwargs)`` pair or a signature of ``task`` (``task.s(...)``,
    whose own options win over ``options``)."""
    return _dispatch(task, calls, options, form="apply_async")


def _dispatch(task: Any, items: Iterable[Any], options: dict[str, Any], *, form: str) -> list[Any]:
    calls = read(task, items, options, form=form)  # raises before anything is sent
    if task.app.conf.task_always_eager:
        return [task.apply_async(call.args, call.kwargs, **call.options) for call in calls]
    results: list[Any] = [None] * len(calls)
    if calls:
        publishing.publish(task, calls, results)
    return results
