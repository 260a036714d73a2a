"""RetryPolicy: the limits of one task's retries, as a frozen, validated value."""

from __future__ import annotations

import dataclasses
import math

from jobs_platform.errors import ConfigError
from jobs_platform.retry.backoff import UniformRng, equal_jitter_delay

#: A ceiling on ``max_retries``: unbounded retries are how "a bug that retries forever" happens.
MAX_RETRIES_CEILING = 1000


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a task is retried.

    ``max_retries`` counts retries *after* the first attempt (Celery's meaning), so a
    task runs at most ``max_retries + 1`` times. ``backoff_s`` is the first wait's
    upper bound, doubled each retry up to ``backoff_max_s``; with ``jitter`` the wait
    is drawn uniformly from the upper half of that window (never 0 s).
    """

    max_retries: int = 5
    backoff_s: float = 2.0
    backoff_max_s: float = 300.0
    jitter: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ConfigError(
                f"max_retries must be an int between 0 and {MAX_RETRIES_CEILING}, "
                f"got {self.max_retries!r} (None would mean 'retry forever', which is refused)"
            )
        if not 0 <= self.max_retries <= MAX_RETRIES_CEILING:
            raise ConfigError(
                f"max_retries must be between 0 and {MAX_RETRIES_CEILING}, got {self.max_retries}"
            )
        for name in ("backoff_s", "backoff_max_s"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
            if value <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {value!r}")
        if self.backoff_max_s < self.backoff_s:
            raise ConfigError(
                f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_s ({self.backoff_s})"
            )

    @property
    def longest_wait_s(self) -> float:
        """The longest single wait this policy can ask for (Retry-After is capped to it too)."""
        return float(self.backoff_max_s)

    def delay_for(
        self,
        retry_number: int,
        *,
        retry_after_s: float | None = None,
        rng: UniformRng | None = None,
    ) -> float:
        """Seconds before retry ``retry_number`` (1-based); Retry-After wins, up to the cap."""
        delay = equal_jitter_delay(
            retry_number, self.backoff_s, self.backoff_max_s, jitter=self.jitter, rng=rng
        )
        if retry_after_s is not None and retry_after_s > 0:
            delay = max(delay, min(float(retry_after_s), self.backoff_max_s))
        return delay

    def replace(self, **changes: object) -> RetryPolicy:
        """A validated copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
