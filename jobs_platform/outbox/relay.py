"""The relay: every worker publishes the committed outbox rows, each once.

:class:`RelayStep` (a bootstep, in the worker's main process) runs a thread that calls
:func:`relay_once` every ``JOBS_OUTBOX_RELAY_INTERVAL`` seconds, and again at once while
it finds full batches. One pass, in one database transaction:

1. **claim** up to ``JOBS_OUTBOX_RELAY_BATCH`` unpublished rows, oldest first. PostgreSQL:
   ``SELECT ... FOR UPDATE SKIP LOCKED``, so relays racing over the table take disjoint
   rows and never wait on each other. SQLite: ``UPDATE ... RETURNING``, which takes the
   database's one write lock, so a second relay waits and then finds the rows published;
2. **publish** them through the bulk path (one pipelined write per chunk), with the task
   id, arguments and options the producer's call gave;
3. **mark** them published (``published_at``) and commit.

A failed publish rolls the claim back: the rows go out on a later pass. A relay that dies
after the broker took the messages and before its commit leaves the rows unpublished,
and another pass publishes them again with the same task ids: delivery is at least once,
as everywhere on the platform, and the idempotency guards recognise the repeat.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from celery import bootsteps
from kombu.utils.json import loads

from jobs_platform import db
from jobs_platform.bulk import publish as publishing
from jobs_platform.bulk.calls import Call
from jobs_platform.clock import utcnow
from jobs_platform.outbox.model import job_outbox
from jobs_platform.process_local import fork_safe

logger = logging.getLogger("jobs_platform.outbox")

_COLUMNS = (
    job_outbox.c.id,
    job_outbox.c.task_id,
    job_outbox.c.task_name,
    job_outbox.c.payload,
    job_outbox.c.options,
)
_PENDING = job_outbox.c.published_at.is_(None)


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    id: int
    task_id: str
    task_name: str
    payload: str
    options: str


def relay_once(
    app: Any,
    *,
    limit: int | None = None,
    engine: sa.Engine | None = None,
    send: Callable[[Any, Sequence[Row]], None] | None = None,
) -> int:
    """Publish up to ``limit`` committed rows of ``app``'s outbox; how many went out.

    ``send(app, rows)`` publishes the claimed rows (:func:`publish`, the broker); it must
    raise if they did not all go out, which rolls the claim back."""
    settings = app.jobs_settings
    engine = engine or db.engine_for(settings.database_url)
    limit = int(limit or settings.outbox_relay_batch)
    sqlite = engine.dialect.name == "sqlite"
    if sqlite and not _any_pending(engine):
        return 0  # the usual pass on SQLite: a read, no write lock taken
    with engine.connect() as conn, conn.begin():
        rows = _claim_sqlite(conn, limit) if sqlite else _claim_postgresql(conn, limit)
        if not rows:
            return 0
        (send or publish)(app, rows)
        if not sqlite:
            ids = [row.id for row in rows]
            conn.execute(
                sa.update(job_outbox).where(job_outbox.c.id.in_(ids)).values(published_at=utcnow())
            )
    return len(rows)


def _any_pending(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return conn.execute(sa.select(job_outbox.c.id).where(_PENDING).limit(1)).first() is not None


def _claim_postgresql(conn: sa.Connection, limit: int) -> list[Row]:
    query = (
        sa.select(*_COLUMNS)
        .where(_PENDING)
        .order_by(job_outbox.c.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return [Row(*r) for r in conn.execute(query)]


def _claim_sqlite(conn: sa.Connection, limit: int) -> list[Row]:
    oldest = sa.select(job_outbox.c.id).where(_PENDING).order_by(job_outbox.c.id).limit(limit)
    claim = (
        sa.update(job_outbox)
        .where(job_outbox.c.id.in_(oldest.scalar_subquery()))
        .values(published_at=utcnow())
        .returning(*_COLUMNS)
    )
    return sorted((Row(*r) for r in conn.execute(claim)), key=lambda row: row.id)


def publish(app: Any, rows: Sequence[Row]) -> None:
    """Send ``rows`` as their producers' calls would have been sent (raises if the broker
    did not take them all)."""
    by_task: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_task[row.task_name].append(row)
    for name, group in by_task.items():
        calls = []
        for index, row in enumerate(group):
            args, kwargs = loads(row.payload)
            options = loads(row.options)
            calls.append(Call(index, tuple(args), kwargs, options, row.task_id, True, row.payload))
        task = app._tasks.get(name)  # not .tasks: that would finalize a producer's app
        if task is None:
            # Not declared in this process (a worker of another release): Celery sends by
            # name, with the same id, arguments and options.
            for call in calls:
                app.send_task(name, call.args, call.kwargs, task_id=call.task_id, **call.options)
            continue
        publishing.publish(task, calls, [None] * len(calls))


def _log_failure(app: Any, exc: Exception) -> None:
    """Once per failing spell: a table not there yet (a worker starting before its first
    migration, which the drainer runs) is a warning; anything else an error."""
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    try:
        with db.engine_for(app.jobs_settings.database_url).connect() as conn:
            missing = not sa.inspect(conn).has_table(job_outbox.name)
    except Exception:
        missing = False
    if missing:
        logger.warning(
            "jobs.outbox.relay_waiting: %s does not exist yet (celery -A APP db upgrade); "
            "the relay tries again every pass",
            job_outbox.name,
            extra={"event": "jobs.outbox.relay_failed"},
        )
        return
    logger.error(
        "jobs.outbox.relay_failed: committed jobs wait in job_outbox until the database "
        "and the broker answer: %s",
        reason,
        extra={"event": "jobs.outbox.relay_failed"},
    )


def relay_interval(app: Any) -> float:
    return float(app.jobs_settings.outbox_relay_interval)


class RelayStep(bootsteps.StartStopStep):  # type: ignore[misc]
    label = "outbox relay"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(parent.app,), name="jobs-outbox-relay", daemon=True
        )
        self._thread.start()

    def _run(self, app: Any) -> None:
        interval = relay_interval(app)
        batch = int(app.jobs_settings.outbox_relay_batch)
        failing = False
        while not self._stop.is_set():
            sent = 0
            try:
                with fork_safe():  # a pool process forked meanwhile would hang in SQLite
                    sent = relay_once(app, limit=batch)
            except Exception as exc:  # database or broker down: the rows wait; next pass
                if not failing:
                    _log_failure(app, exc)
                failing = True
            else:
                if failing:
                    logger.info(
                        "jobs.outbox.relay_resumed", extra={"event": "jobs.outbox.relay_resumed"}
                    )
                failing = False
            if sent < batch:  # a full batch: more may be waiting, go again at once
                self._stop.wait(interval)

    def stop(self, parent: Any) -> None:
        self._halt()

    def terminate(self, parent: Any) -> None:
        self._halt()

    def _halt(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=10)
