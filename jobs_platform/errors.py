"""The one exception tree of jobs-platform.

::

    JobsPlatformError               root: catch this to catch everything we raise
     ├── ConfigError                a declaration or setting breaks an invariant (import/start-up)
     ├── DispatchError              a call that cannot be enqueued safely (at .delay()/.apply_async())
     └── TaskError                  raised by task bodies to steer classification
          ├── TransientError        retry with backoff (may carry ``retry_after_s``)
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
