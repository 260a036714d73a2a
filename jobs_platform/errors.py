"""The one exception tree of jobs-platform.

::

    JobsPlatformError               root: catch this to catch everything we raise
     ├── ConfigError                a declaration or setting breaks an invariant (import/start-up)
     ├── DispatchError              a call that cannot be enqueued safely (at .delay())
     ├── SkipTransition             control flow: a guarded side effect must not run (a duplicate)
     │    └── LostRace              another live claimant holds the row
     └── TaskError                  raised by task bodies to steer classification
          ├── TransientError        retry with backoff (may carry ``retry_after_s``)
          │    └── KeyInUse         another worker holds the idempotency key right now
          └── PermanentError        fail now, no retry: retrying cannot help

Apps subclass :class:`TransientError` / :class:`PermanentError` for their own
errors, or list foreign exception types in a task's ``transient_errors`` /
``permanent_errors``. Each class's docstring is its default message.
"""

from __future__ import annotations


class JobsPlatformError(Exception):
    """A jobs-platform error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class ConfigError(JobsPlatformError):
    """The configuration breaks a reliability invariant."""


class DispatchError(JobsPlatformError):
    """The task cannot be enqueued safely."""


class TaskError(JobsPlatformError):
    """A task failed."""


class TransientError(TaskError):
    """A transient failure: the task will be retried with backoff."""

    def __init__(self, message: str | None = None, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        #: A server-suggested wait (e.g. ``Retry-After``), honoured up to the policy cap.
        self.retry_after_s = retry_after_s


class PermanentError(TaskError):
    """A permanent failure: retrying cannot help, so the task fails at once."""


class SkipTransition(JobsPlatformError):
    """The row is not in a claimable state: the side effect must not run (a duplicate)."""

    def __init__(self, message: str | None = None, *, status: str | None = None) -> None:
        super().__init__(message)
        #: The status the row was found in (``None`` if it could not be read).
        self.status = status


class LostRace(SkipTransition):
    """Another live claimant holds the row: it runs the side effect, this delivery does not."""


class KeyInUse(TransientError):
    """Another worker holds this idempotency key: retry later to get its recorded result."""
