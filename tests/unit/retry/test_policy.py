"""RetryPolicy: validated at construction, frozen, Retry-After honoured up to the cap."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from jobs_platform import ConfigError, RetryPolicy


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_retries": None}, "retry forever"),
        ({"max_retries": -1}, "between 0 and 1000"),
        ({"max_retries": 1001}, "between 0 and 1000"),
        ({"max_retries": 2.5}, "must be an int"),
        ({"max_retries": True}, "must be an int"),
        ({"backoff_s": 0}, "backoff_s must be > 0"),
        ({"backoff_s": -3}, "backoff_s must be > 0"),
        ({"backoff_s": math.inf}, "finite"),
        ({"backoff_s": math.nan}, "finite"),
        ({"backoff_s": "2"}, "finite number"),
        ({"backoff_s": 10, "backoff_max_s": 5}, "must be >= backoff_s"),
    ],
)
def test_nonsense_is_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RetryPolicy(**changes)  # type: ignore[arg-type]


def test_policy_is_frozen_and_copies_validate() -> None:
    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_retries = 9  # type: ignore[misc]
    assert policy.replace(max_retries=9).max_retries == 9
    with pytest.raises(ConfigError):
        policy.replace(max_retries=-5)
    assert (
        repr(policy)
        == "RetryPolicy(max_retries=5, backoff_s=2.0, backoff_max_s=300.0, jitter=True)"
    )


def test_retry_after_wins_but_never_beyond_the_cap() -> None:
    policy = RetryPolicy(backoff_s=1, backoff_max_s=30, jitter=False)
    assert policy.delay_for(1) == 1
    assert policy.delay_for(1, retry_after_s=12) == 12
    assert policy.delay_for(1, retry_after_s=3600) == 30  # capped
    assert policy.delay_for(5, retry_after_s=2) == 16  # backoff already longer
    assert policy.delay_for(1, retry_after_s=0) == 1


def test_delays_with_jitter_respect_bounds() -> None:
    policy = RetryPolicy(backoff_s=2, backoff_max_s=20)
    rng = random.Random(42)
    for n in range(1, 10):
        window = min(2 * 2 ** (n - 1), 20)
        delay = policy.delay_for(n, rng=rng)
        assert window / 2 <= delay <= window
