"""jobs-platform: Celery background work that survives failure.

Public API::

    from jobs_platform import create_app, ReliableTask, TransientError, PermanentError
"""

from jobs_platform.app import create_app
from jobs_platform.errors import (
    ConfigError,
    DispatchError,
    JobsPlatformError,
    KeyInUse,
    LostRace,
    PermanentError,
    SkipTransition,
    TransientError,
)
from jobs_platform.idempotency import IdempotencyKeys, Transition, claim_columns, transition
from jobs_platform.retry import RetryPolicy
from jobs_platform.settings import Settings
from jobs_platform.task import ReliableTask

__all__ = [
    "ConfigError",
    "DispatchError",
    "IdempotencyKeys",
    "JobsPlatformError",
    "KeyInUse",
    "LostRace",
    "PermanentError",
    "ReliableTask",
    "RetryPolicy",
    "Settings",
    "SkipTransition",
    "TransientError",
    "Transition",
    "claim_columns",
    "create_app",
    "transition",
]
