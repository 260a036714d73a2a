"""Celery's check of a task's arguments against its signature, skipped for a job already
checked.

Celery binds the arguments of every ``apply_async`` to the task's signature (the task's
``__header__``). A job ReliableTask publishes again (a retry, a deferral, a bulk or outbox
publish, a replay) was checked when first dispatched, and may be of an older payload version
that binds only once upcast (:mod:`jobs_platform.versions`): inside :func:`unchecked` the
check is skipped. The worker's version screen binds with the check itself
(``check_arguments.jobs_check``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

#: Set while a job already checked is published again: Celery's argument check is skipped.
_UNCHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("jobs_unchecked", default=False)


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Publish without Celery's ``typing`` check of the arguments (see the module docstring)."""
    token = _UNCHECKED.set(True)
    try:
        yield
    finally:
        _UNCHECKED.reset(token)


def skippable(check: Callable[..., Any]) -> Callable[..., Any]:
    """``check`` (a task's ``__header__``), skipped inside :func:`unchecked`."""

    def check_arguments(*args: Any, **kwargs: Any) -> Any:
        if _UNCHECKED.get():
            return None
        return check(*args, **kwargs)

    check_arguments.jobs_check = check  # type: ignore[attr-defined]
    return check_arguments
