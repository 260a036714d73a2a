"""Revoke that also reaches jobs waiting in the delayed store.

Celery's revoke tells the running workers to skip a task id; a job still in the store is
in no worker, and a worker started after the revoke would not know it. So
``AsyncResult(id).revoke()`` (and ``app.control.revoke``) first removes the job from the
store, atomically (once removed it can never be released), then does Celery's normal
revoke for a job already released or short-delayed. ``celery -A APP delayed cancel``
uses :func:`cancel_delayed` alone.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.app.control import Control as CeleryControl

from jobs_platform.delayed import cancel_delayed

logger = logging.getLogger("jobs_platform.delayed")


class Control(CeleryControl):  # type: ignore[misc]
    """Celery's ``app.control`` whose :meth:`revoke` also cancels delayed jobs."""

    def revoke(self, task_id: Any, *args: Any, **kwargs: Any) -> Any:
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        for one in ids:
            job = cancel_delayed(self.app, str(one))
            if job is not None:
                logger.info(
                    "jobs.delayed.revoked: %s[%s] removed from the delayed store",
                    job.task,
                    one,
                    extra={"event": "jobs.delayed.revoked", "task_id": one},
                )
        return super().revoke(task_id, *args, **kwargs)
