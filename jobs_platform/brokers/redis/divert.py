"""Which delayed messages wait in the store instead of in a worker's memory (pure).

Celery hands a message with an ``eta`` to a worker at once; the worker holds it
unacknowledged, in memory, until it is due and then runs it. The worker's lease keeps it
there while the worker lives (:mod:`.liveness`), but the visibility timeout is the
backstop for any held message, and a wait held in memory is lost to every restart, to
``delayed list`` and to ``delayed cancel``: so only a wait *plus the run* that ends safely
inside the backstop, ``wait + hard limit < visibility timeout - margin``, stays there. A
message for which that does not hold is stored instead and released onto its queue when
due; every other one keeps Celery's own path.

The hard limit is read from the message (protocol 2 ``timelimit`` header, ``[hard,
soft]``); a message without one counts as 0 s, so ``send_task`` by name should pass
``time_limit`` when it matters (a task object's ``apply_async`` always does).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from jobs_platform.clock import as_utc


def eta_of(headers: Mapping[str, Any]) -> dt.datetime | None:
    """The message's ETA as aware UTC (Celery reads a naive one as UTC), or ``None``."""
    value = headers.get("eta")
    if not isinstance(value, str) or not value:
        return None
    try:
        return as_utc(dt.datetime.fromisoformat(value))
    except ValueError:
        return None  # Celery reports the bad ETA itself when the message is consumed


def hard_limit_of(headers: Mapping[str, Any]) -> float:
    """Seconds the run may last: the larger of the ``timelimit`` values, else 0.

    Celery writes ``[hard, soft]``; the larger one is the hard limit whatever the order.
    """
    limits = headers.get("timelimit")
    if not isinstance(limits, list | tuple):
        return 0.0
    numbers = [float(v) for v in limits if isinstance(v, int | float) and not isinstance(v, bool)]
    return max([0.0, *numbers])


def due_ms(
    message: Mapping[str, Any],
    *,
    now_s: float,
    visibility_timeout_s: float,
    margin_s: float,
) -> int | None:
    """When ``message`` is due (ms since the epoch) if it must wait in the store, else None.

    ``message`` is kombu's message dict (``headers``, ``properties``, ``body``). Messages
    without a task id or an ETA, and ETAs already past, are never stored.
    """
    headers = message.get("headers")
    if not isinstance(headers, Mapping) or not headers.get("id"):
        return None
    eta = eta_of(headers)
    if eta is None:
        return None
    wait_s = eta.timestamp() - now_s
    if wait_s <= 0:
        return None
    if wait_s + hard_limit_of(headers) < visibility_timeout_s - margin_s:
        return None
    return round(eta.timestamp() * 1000)
