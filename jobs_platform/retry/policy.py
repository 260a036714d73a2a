"""RetryPolicy: the limits of one task's retries, as a frozen, validated value."""

from __future__ import annotations

import dataclasses

from jobs_platform import rules
from jobs_platform.retry.backoff import UniformRng, equal_jitter_delay


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
        rules.check_retry_policy(self.max_retries, self.backoff_s, self.backoff_max_s)

    @property
    def longest_wait_s(self) -> float:
        """The longest single wait this policy can ask for (Retry-After is capped to it too);
        none when it never retries."""
        return float(self.backoff_max_s) if self.max_retries else 0.0

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
