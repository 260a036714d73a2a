"""Equal-jitter backoff: bounds over many seeded samples, the cap, never zero."""

from __future__ import annotations

import random

import pytest

from jobs_platform.retry.backoff import backoff_window, equal_jitter_delay


@pytest.mark.parametrize(
    ("retry_number", "base_s", "cap_s", "window"),
    [
        (1, 2.0, 300.0, 2.0),
        (2, 2.0, 300.0, 4.0),
        (5, 2.0, 300.0, 32.0),
        (9, 2.0, 300.0, 300.0),  # 512 capped
        (10_000, 2.0, 300.0, 300.0),  # exponent clamped: no overflow
        (3, 0.5, 0.75, 0.75),
    ],
)
def test_window_doubles_and_is_capped(
    retry_number: int, base_s: float, cap_s: float, window: float
) -> None:
    assert backoff_window(retry_number, base_s, cap_s) == window


def test_samples_stay_in_upper_half_of_window_and_never_zero() -> None:
    rng = random.Random(1337)
    for retry_number in range(1, 15):
        window = backoff_window(retry_number, 1.5, 60.0)
        samples = [equal_jitter_delay(retry_number, 1.5, 60.0, rng=rng) for _ in range(2000)]
        assert min(samples) >= window / 2 > 0
        assert max(samples) <= window <= 60.0
        # The draws really spread over the interval (not a constant).
        assert max(samples) - min(samples) > window * 0.4


def test_same_seed_same_delays() -> None:
    first = [equal_jitter_delay(n, 2, 300, rng=random.Random(7)) for n in range(1, 8)]
    second = [equal_jitter_delay(n, 2, 300, rng=random.Random(7)) for n in range(1, 8)]
    assert first == second


def test_without_jitter_the_wait_is_the_window() -> None:
    assert [equal_jitter_delay(n, 2, 10, jitter=False) for n in (1, 2, 3, 4)] == [2, 4, 8, 10]


class _Edges:
    """An RNG returning values just outside [a, b], as float rounding could."""

    def __init__(self) -> None:
        self.calls = 0

    def uniform(self, a: float, b: float) -> float:
        self.calls += 1
        return a - 1e-9 if self.calls % 2 else b + 1e-9


def test_rounding_never_escapes_the_bounds() -> None:
    rng = _Edges()
    assert equal_jitter_delay(3, 2, 300, rng=rng) == 4.0
    assert equal_jitter_delay(3, 2, 300, rng=rng) == 8.0


def test_retry_number_must_be_positive() -> None:
    with pytest.raises(ValueError, match="retry_number"):
        backoff_window(0, 1, 2)
