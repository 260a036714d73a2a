"""A clock that moves only when the test says so (pure).

The platform reads time through two kinds of clock, and :class:`FakeClock` is both:

- monotonic seconds, ``Callable[[], float]``: pass ``clock.monotonic`` to
  ``WebhookNotifier(url, interval_s, clock=...)``;
- aware UTC datetimes, ``Callable[[], datetime]``: pass ``clock.now`` to
  ``IdempotencyKeys(url, ttl_s=..., clock=...)`` and ``transition(..., clock=...)``.

It reaches only objects built in the test's own process. Worker processes, Celery's
countdowns and the broker's visibility timeout run on real time.
"""

from __future__ import annotations

import datetime as dt
import math
import threading

from jobs_platform.clock import as_utc

#: A fixed, readable start, so values in assertions and failure messages are reproducible.
DEFAULT_START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class FakeClock:
    """Monotonic seconds and a UTC wall clock that advance together, by :meth:`advance` only.

    ``monotonic()`` starts at 0.0 by default, like the uptime of a machine that has just
    booted: code that takes "0.0" to mean "long ago" is caught by it (on Linux
    ``time.monotonic()`` counts from boot, and CI machines are often that young).
    """

    def __init__(self, start: dt.datetime = DEFAULT_START, *, monotonic_start: float = 0.0) -> None:
        _check_finite(monotonic_start, "monotonic_start")
        self._start = as_utc(start)  # naive means UTC, as everywhere in the platform
        self._monotonic_start = float(monotonic_start)
        self._elapsed = 0.0
        # Notifiers read their clock from a thread of their own.
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        """Seconds with an arbitrary origin, as ``time.monotonic()``."""
        with self._lock:
            return self._monotonic_start + self._elapsed

    def now(self) -> dt.datetime:
        """The current aware UTC datetime, as ``jobs_platform.clock.utcnow()``."""
        with self._lock:
            return self._start + dt.timedelta(seconds=self._elapsed)

    def advance(self, seconds: float | dt.timedelta) -> None:
        """Move both readings forward; time never runs backwards, so a negative step is refused."""
        step = seconds.total_seconds() if isinstance(seconds, dt.timedelta) else float(seconds)
        _check_finite(step, "advance")
        if step < 0:
            raise ValueError(f"a clock does not run backwards: advance({seconds!r})")
        with self._lock:
            self._elapsed += step

    @property
    def elapsed(self) -> float:
        """Seconds advanced since the clock was made."""
        with self._lock:
            return self._elapsed

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now().isoformat()}, monotonic={self.monotonic():g})"


def _check_finite(value: float, what: str) -> None:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds, got {value!r}")
