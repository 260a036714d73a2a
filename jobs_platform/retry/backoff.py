"""Equal-jitter exponential backoff, as a pure function.

The n-th retry (n >= 1) waits a uniform random time in ``[w/2, w]`` where
``w = min(base_s * 2**(n-1), cap_s)``. Unlike full jitter (Celery's
``retry_jitter``, which draws from ``[0, w]``) it never waits ~0 s, so a
struggling dependency is not hammered by an unlucky draw; the spread still
de-synchronises a thundering herd.
"""

from __future__ import annotations

import random
from typing import Protocol

# 2**62 already exceeds any sane cap; clamping the exponent avoids huge ints/overflow.
_MAX_EXPONENT = 62


class UniformRng(Protocol):
    def uniform(self, a: float, b: float) -> float: ...


def backoff_window(retry_number: int, base_s: float, cap_s: float) -> float:
    """The upper bound ``w`` of the wait before retry number ``retry_number`` (1-based)."""
    if retry_number < 1:
        raise ValueError(f"retry_number must be >= 1, got {retry_number}")
    exponent = min(retry_number - 1, _MAX_EXPONENT)
    return float(min(base_s * (2**exponent), cap_s))


def equal_jitter_delay(
    retry_number: int,
    base_s: float,
    cap_s: float,
    *,
    jitter: bool = True,
    rng: UniformRng | None = None,
) -> float:
    """Seconds before retry ``retry_number``: in ``[w/2, w]``; exactly ``w`` without jitter."""
    window = backoff_window(retry_number, base_s, cap_s)
    if not jitter:
        return window
    draw = (rng or random).uniform(window / 2, window)
    # uniform() may round to a hair outside the interval; keep the documented bounds exact.
    return min(max(draw, window / 2), window)
