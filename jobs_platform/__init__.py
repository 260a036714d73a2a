"""jobs-platform: Celery background work that survives failure.

Public API::

    from jobs_platform import create_app, ReliableTask, TransientError, PermanentError
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jobs_platform.app import create_app
from jobs_platform.batches import Batch, batch
from jobs_platform.bulk import BulkDispatchError
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
from jobs_platform.retry import RetryPolicy
from jobs_platform.settings import Settings
from jobs_platform.task import ReliableTask

if TYPE_CHECKING:
    from jobs_platform.idempotency import IdempotencyKeys, Transition, claim_columns, transition

__all__ = [
    "Batch",
    "BulkDispatchError",
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
    "batch",
    "claim_columns",
    "create_app",
    "transition",
]

#: The database guards load SQLAlchemy, which a producer (a web process that only calls
#: ``.delay()``) never needs: they are imported on first use.
_LAZY = frozenset({"IdempotencyKeys", "Transition", "claim_columns", "transition"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module("jobs_platform.idempotency"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
