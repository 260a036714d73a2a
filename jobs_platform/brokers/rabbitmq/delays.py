"""A countdown or ETA as RabbitMQ's native delayed delivery can carry it (pure: no Celery).

Celery sends a delayed message through ``celery_delayed_27`` .. ``_0`` with a routing key
spelling the delay in **whole seconds**, truncated with ``int()``, and raises ``ValueError``
for a countdown under one second. The platform rounds **up** instead, so no wait is ever
shorter than asked (a retry's wait keeps its policy's lower bound): 2.4 s waits 3 s, 0.3 s
waits 1 s, and 0 or less (an ETA already past) is sent without delay. An ETA becomes the
countdown to it, rounded up the same way, so the message arrives when due and no worker
holds it unacknowledged waiting for the rest of a second.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

#: The longest delay the 28 levels can spell (2^28 - 1 s, ~8.5 years); JOBS_MAX_DELAY is far below.
LONGEST_S = 2**28 - 1
#: The delay Celery spells in front of a routing key: 28 bits, one word each.
DELAY_PREFIX = re.compile(r"^(?:[01]\.){28}")


def queue_key(routing_key: str) -> str:
    """``routing_key`` without a delay prefix (a delayed message keeps it on arrival)."""
    return DELAY_PREFIX.sub("", routing_key, count=1)


def whole_seconds(delay_s: float) -> int:
    """The broker delay for a wait of ``delay_s``: rounded up; 0 means no delay."""
    if not delay_s > 0:
        return 0
    # A float a hair above a whole number (1.0000000001 from arithmetic) is that number.
    return min(LONGEST_S, math.ceil(round(delay_s, 6)))


def seconds_until(eta: Any, now: dt.datetime) -> float:
    """Seconds from ``now`` (aware UTC) to ``eta`` (a datetime or an ISO string)."""
    when = dt.datetime.fromisoformat(eta) if isinstance(eta, str) else eta
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return (when - now).total_seconds()


def rounded(options: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
    """``options`` of a publish with ``countdown``/``eta`` made one whole-second countdown
    (or none); other options untouched."""
    countdown, eta = options.get("countdown"), options.get("eta")
    if countdown is None and eta is None:
        return options
    wait = float(countdown) if countdown is not None else seconds_until(eta, now)
    whole = whole_seconds(wait)
    out = {k: v for k, v in options.items() if k not in ("countdown", "eta")}
    if whole:
        out["countdown"] = whole
    return out
