"""Pure retry policy: when to retry (classify), how long to wait (backoff), and the limits (policy).

Nothing in this package imports Celery, so it is unit-tested in milliseconds (the
worker-side end of a published retry is :mod:`jobs_platform.cheap_retry`).
"""

from jobs_platform.retry.backoff import equal_jitter_delay
from jobs_platform.retry.classify import (
    Attempt,
    Classifier,
    Decision,
    Fail,
    Retry,
    default_classifier,
)
from jobs_platform.retry.policy import RetryPolicy

__all__ = [
    "Attempt",
    "Classifier",
    "Decision",
    "Fail",
    "Retry",
    "RetryPolicy",
    "default_classifier",
    "equal_jitter_delay",
]
