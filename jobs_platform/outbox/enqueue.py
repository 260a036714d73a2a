"""``task.delay_on_commit(session, ...)``: the job as a row in the caller's transaction.

Every check ``.delay()`` makes runs here, at the call (declared queue, delay within
``JOBS_MAX_DELAY``, the task's signature, JSON and ``JOBS_MAX_PAYLOAD_BYTES``, the
concurrency key), plus the outbox's own: the session is on the platform's database and the
options are ones the relay can send as given. The row is inserted through the session, so
it is part of whatever transaction (or savepoint) is open: a rollback removes it, a commit
makes it visible to the relay. Nothing is buffered in the process and no commit hook is
used (SQLAlchemy's ``after_commit`` also fires when a savepoint is released, and a process
killed between a commit and a hook would lose the job).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from celery.utils import uuid
from kombu.exceptions import EncodeError

from jobs_platform import arguments, dispatch
from jobs_platform.bulk.calls import check_arguments
from jobs_platform.bulk.messages import COPYABLE_OPTIONS
from jobs_platform.clock import utcnow
from jobs_platform.errors import DispatchError
from jobs_platform.flow import task as flow_task
from jobs_platform.idempotency import unique
from jobs_platform.outbox.database import same_database
from jobs_platform.outbox.model import job_outbox
from jobs_platform.urls import masked

#: The options a job dispatched on commit may carry: those the relay's bulk publish sends
#: exactly as ``apply_async`` would (jobs_platform.bulk.messages).
OPTIONS = COPYABLE_OPTIONS


def add(task: Any, session: Any, args: Any, kwargs: Any, options: Mapping[str, Any]) -> Any:
    """Check the call, insert its row through ``session``; the job's AsyncResult (its id is
    the one the relay publishes it with)."""
    _check_session(task, session)
    _check_task(task)
    options = dict(options)
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise DispatchError(
            f"{task.name}: {', '.join(unknown)} cannot be dispatched on commit (the relay "
            f"sends only {', '.join(sorted(OPTIONS))}); nothing was written"
        )
    dispatch.check_options(task, options)
    options = dispatch.versioned(task, options)  # the relay may run other code: sent as is
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    payload = check_arguments(task, args, kwargs)  # a TypeError for the signature, as .delay()
    if task.spec.concurrency is not None:
        flow_task.check_concurrency_key(task, args, kwargs)
    if task.spec.unique_for_s is not None:
        # The row is the job's one dispatch, published with its own id as a dispatch with an
        # explicit task_id is (no lock to outlive a rollback); the key must still be there.
        unique.identity_of(task, args, kwargs)
    task_id = str(options.pop("task_id", None) or uuid())
    now = utcnow()
    countdown = options.pop("countdown", None)
    if countdown is not None:  # the delay counts from the call, not from the relay
        options["eta"] = (now + dt.timedelta(seconds=float(countdown))).isoformat()
    elif isinstance(options.get("eta"), dt.datetime):
        options["eta"] = options["eta"].isoformat()
    try:
        stored_options = arguments.dumps(options)
    except (TypeError, ValueError, EncodeError) as exc:
        raise DispatchError(
            f"{task.name}: the options are not JSON ({exc}); nothing was written"
        ) from exc
    session.execute(
        sa.insert(job_outbox).values(
            task_id=task_id,
            task_name=task.name,
            payload=payload,
            options=stored_options,
            created_at=now,
        )
    )
    return task.AsyncResult(task_id)


def _check_task(task: Any) -> None:
    if task.spec.debounce is not None:
        raise DispatchError(
            f"{task.name}: a debounced task is dispatched with .delay(), not on commit (each "
            "dispatch joins its key's window in Redis, which a rollback cannot take back); "
            "nothing was written"
        )


def _check_session(task: Any, session: Any) -> None:
    """The session's database is the platform's (``JOBS_DATABASE_URL``): a row anywhere else
    is never published."""
    expected = task.app.jobs_settings.database_url
    try:
        bind = session.get_bind()
    except Exception as exc:
        raise DispatchError(
            f"{task.name}: delay_on_commit needs a SQLAlchemy Session bound to the platform's "
            f"database ({masked(expected)}): {exc}; nothing was written"
        ) from exc
    url = getattr(getattr(bind, "engine", bind), "url", None)
    if url is None or not same_database(url, expected):
        shown = masked(url.render_as_string()) if url is not None else repr(bind)
        raise DispatchError(
            f"{task.name}: delay_on_commit's session is on {shown}, not on the platform's "
            f"database {masked(expected)} (JOBS_DATABASE_URL), whose workers relay the "
            "outbox; nothing was written"
        )
