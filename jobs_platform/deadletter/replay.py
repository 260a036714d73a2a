"""Replay dead letters through the normal dispatch, exactly once per row.

:func:`replay_rows` replays a selection, one :class:`~.store.Outcome` per row, throttled
(``celery -A APP dlq replay`` renders them); :func:`replay` replays one row.

A replay sends the stored args/kwargs to the original queue with the original priority
and the job's custom headers (never Celery's protocol headers: see
:data:`PROTOCOL_HEADERS`), under a *new* task id, with a fresh attempt budget (no
retries counted, no error history) and the header ``jobs_replay_of=<row id>`` so that a
replay that dies again links back. The row moves ``dead -> replayed`` in the same
transaction that publishes (see :meth:`DeadLetterStore.replay`), so replaying the same
row twice enqueues once.

A row keeps the payload version it was dispatched with (``jobs_version``), so the worker
that runs the replay upcasts it with its own upcasters. Before sending, a replay (dry run
included) checks that the row fits the code doing the replay: upcast, then bound to the
task's signature (:func:`fits_in`); a row that would die of a ``TypeError`` is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from celery.app.task import Context
from celery.exceptions import QueueNotFound

from jobs_platform import arguments, history, signature_check, versions
from jobs_platform.clock import utc_iso
from jobs_platform.deadletter.store import DeadLetterStore, Outcome
from jobs_platform.errors import JobsPlatformError

Publish = Callable[[dict[str, Any], str], None]

#: Headers that belong to the failed chain, not to the job: a replay starts afresh.
CHAIN_HEADERS = (
    history.ERRORS_HEADER,
    history.ENQUEUED_HEADER,
    history.REPLAY_OF_HEADER,
    history.VERSION_WAIT_HEADER,
    history.CANVAS_HEADER,
)
#: Celery's own message headers (task protocol 2), which Celery sets for each message.
#: Passed to ``apply_async(headers=...)`` they would *override* the new message's
#: (``headers2.update(headers)`` in celery/app/amqp.py): the old task id, its retries, a
#: past ``expires``... A poison row stores the raw headers of the message as it arrived.
PROTOCOL_HEADERS = frozenset(
    {
        *(k for k in vars(Context) if not k.startswith("__")),
        # the rest of Celery's own (as in Context._get_custom_headers), and protocol 2's
        "lang",
        "task",
        "id",
        "argsrepr",
        "kwargsrepr",
        "compression",
        "origin",
        "retries",
        "expires",
        "eta",
        "timelimit",
        "group",
        "group_index",
        "root_id",
        "parent_id",
        "shadow",
        "ignore_result",
        "stamped_headers",
        "stamps",
        "replaced_task_nesting",
        "periodic_task_name",
        "task_name",
    }
)


def replay_headers(headers: dict[str, Any] | None) -> dict[str, Any]:
    """The headers a replay sends: the job's custom ones only (no protocol, no chain)."""
    return {
        k: v
        for k, v in (headers or {}).items()
        if isinstance(k, str) and k not in PROTOCOL_HEADERS and k not in CHAIN_HEADERS
    }


class ReplayRefused(JobsPlatformError):
    """This dead letter cannot be replayed as stored."""


def check_replayable(row: dict[str, Any], *, allow_redacted: bool = False) -> None:
    if row["status"] != "dead":
        raise ReplayRefused(f"dead letter {row['id']} is {row['status']}, not dead")
    if row["reason"] == "upstream_failed":
        raise ReplayRefused(
            f"dead letter {row['id']} is a chain step or chord callback that never ran: its "
            "input (the results of the jobs before it) was never made. Replay the dead jobs "
            "before it, then send this step yourself with their results (a batch's callbacks "
            "fire on replay: jobs_platform.batch)"
        )
    if row["reason"] == "poison" and row["args"] is None:
        raise ReplayRefused(
            f"dead letter {row['id']} is a poison message with no decodable JSON payload"
        )
    if not row["task_name"]:
        raise ReplayRefused(f"dead letter {row['id']} has no task name")
    # Letters keep odd arguments as they arrived (a poison envelope's args may be a string
    # or a dict); Celery would refuse them at publish, which a bulk replay reads as an outage.
    if not isinstance(row["args"], list | tuple | None):
        raise ReplayRefused(
            f"dead letter {row['id']} has args of type {type(row['args']).__name__}, "
            "not a list: Celery cannot send them"
        )
    if not isinstance(row["kwargs"], dict | None):
        raise ReplayRefused(
            f"dead letter {row['id']} has kwargs of type {type(row['kwargs']).__name__}, "
            "not an object: Celery cannot send them"
        )
    for name in ("args", "kwargs", "headers"):
        lost = arguments.unstorable_in(row[name])
        if lost is not None:
            raise ReplayRefused(
                f"dead letter {row['id']}'s {name} held a {lost}, which could not be stored "
                "as it was (the task changed its own arguments?): it cannot be sent again as it "
                "first was"
            )
    if row["redacted"] and not allow_redacted:
        raise ReplayRefused(
            f"dead letter {row['id']} had secrets redacted: a replay would send '***' "
            "instead of them (pass --allow-redacted if the task can cope)"
        )


def publisher(app: Any) -> Publish:
    """``publish(row, new_task_id)`` for :meth:`DeadLetterStore.replay`."""

    def publish(row: dict[str, Any], new_task_id: str) -> None:
        # Stored as sent (kombu's type tags): a datetime or a Decimal is sent as one again.
        args = arguments.from_stored(row["args"] or [])
        kwargs = arguments.from_stored(row["kwargs"] or {})
        headers = replay_headers(arguments.from_stored(row["headers"]))
        headers[history.REPLAY_OF_HEADER] = row["id"]
        if history.BATCH_HEADER in headers and row["task_id"]:
            # The replay runs under a new id: the member it stands for (kept by later replays).
            headers.setdefault(history.BATCH_MEMBER_HEADER, row["task_id"])
        options: dict[str, Any] = {
            "task_id": new_task_id,
            "queue": row["queue"] or None,
            "headers": headers,
        }
        if row["priority"] is not None:
            options["priority"] = row["priority"]
        task = app.tasks.get(row["task_name"])
        if task is not None and getattr(task, "spec", None) is not None:
            # ReliableTask.apply_async stamps a fresh jobs_enqueued_at; retries start at 0.
            # The arguments may be of an older version: fits_in() bound them once upcast.
            with signature_check.unchecked():
                task.apply_async(args=args, kwargs=kwargs, **options)
        elif task is not None:
            task.apply_async(args=args, kwargs=kwargs, **options)
        else:
            headers[history.ENQUEUED_HEADER] = utc_iso()
            app.send_task(row["task_name"], args=args, kwargs=kwargs, **options)

    return publish


def fits_in(app: Any) -> Callable[[dict[str, Any]], None]:
    """``fits(row)``: ReplayRefused unless the row's arguments, upcast from the version they
    were sent with, bind to the signature of ``app``'s task (what its worker would check
    before the body). Rows of tasks this app does not declare with ReliableTask pass."""

    def fits(row: dict[str, Any]) -> None:
        name = row["task_name"]
        task = app.tasks.get(name) if name and registered_in(app)(name) else None
        spec = getattr(task, "spec", None)
        if task is None or spec is None or not isinstance(spec.versions, versions.Versions):
            return
        try:
            headers = arguments.from_stored(row["headers"]) or {}
            versions.fit(
                task.name,
                spec.versions,
                versions.version_of(headers),
                arguments.from_stored(row["args"] or []),
                arguments.from_stored(row["kwargs"] or {}),
                task.bind_arguments,
            )
        except versions.VersionSkew as exc:
            raise ReplayRefused(f"dead letter {row['id']} would fail: {exc}") from exc

    return fits


def registered_in(app: Any) -> Callable[[str], bool]:
    """Whether ``app`` declares a task of that name: its tasks once the modules a worker
    imports at start (``imports``, ``include``) are imported, as a worker would."""

    def registered(name: str) -> bool:
        if name not in app.tasks:
            app.loader.import_default_modules()
        return name in app.tasks

    return registered


def replay_row(
    store: DeadLetterStore,
    row_id: int,
    publish: Publish,
    *,
    reason: str,
    actor: str,
    dry_run: bool = False,
    allow_redacted: bool = False,
    registered: Callable[[str], bool] = lambda _name: True,
    fits: Callable[[dict[str, Any]], None] = lambda _row: None,
) -> Outcome:
    """Replay row ``row_id`` (or, with ``dry_run``, say what would be sent); never refuses
    by raising: a refusal is an outcome. Failures of the broker or database are raised (the
    row stays dead: its publish is inside its transaction). ``registered(task_name)``: whether
    the app knows the task: a poison row of one it does not know would die as poison again.
    ``fits(row)``: the row's arguments fit the task's signature once upcast (:func:`fits_in`);
    the dry run checks it too."""
    row = store.get(row_id)
    if row is None:
        return Outcome(row_id, "missing")
    if row["status"] != "dead":
        return Outcome(row_id, "already_resolved")
    try:
        check_replayable(row, allow_redacted=allow_redacted)
        if row["reason"] == "poison" and not registered(row["task_name"]):
            raise ReplayRefused(
                f"dead letter {row['id']}'s task {row['task_name']!r} is not registered in "
                "this app: no worker would run it (it would die as a poison message again); "
                "replay from the -A app that declares it"
            )
        fits(row)
    except ReplayRefused as exc:
        return Outcome(row_id, "refused", why=str(exc))
    if dry_run:
        sent = {key: row[key] for key in ("task_name", "queue", "args", "kwargs")}
        return Outcome(row_id, "would_replay", would_send=sent)
    try:
        new_id = store.replay(row_id, reason=reason, actor=actor, publish=publish)
    except QueueNotFound as exc:
        return Outcome(row_id, "refused", why=f"its queue is not declared in this app: {exc}")
    if new_id is None:
        return Outcome(row_id, "already_resolved")
    return Outcome(row_id, "replayed", task_id=new_id)


def replay_rows(
    app: Any,
    store: DeadLetterStore,
    ids: Sequence[int],
    *,
    reason: str,
    actor: str,
    rate: float,
    dry_run: bool = False,
    allow_redacted: bool = False,
) -> Iterator[Outcome]:
    """Replay ``ids`` in order, at most ``rate`` per second: one outcome per id, as it goes.

    A refused row (missing, no longer dead, redacted, not replayable, its queue not
    declared) does not stop the others. A broker, result store or database that fails ends
    the run: that row is ``failed`` (it stays dead) and each row after it ``not_attempted``.
    """
    publish = publisher(app)
    for index, row_id in enumerate(ids):
        try:
            outcome = replay_row(
                store,
                row_id,
                publish,
                reason=reason,
                actor=actor,
                dry_run=dry_run,
                allow_redacted=allow_redacted,
                registered=registered_in(app),
                fits=fits_in(app),
            )
        except Exception as exc:
            # The next rows would fail alike.
            yield Outcome(row_id, "failed", why=f"{type(exc).__name__}: {exc}".strip())
            yield from (Outcome(rest, "not_attempted") for rest in ids[index + 1 :])
            return
        yield outcome
        if outcome.outcome == "replayed":
            time.sleep(1.0 / rate)  # throttle: a replay storm must not flood the queue


def replay(
    app: Any,
    store: DeadLetterStore,
    row_id: int,
    *,
    reason: str,
    actor: str,
    allow_redacted: bool = False,
) -> str | None:
    """Replay row ``row_id``: the new task id, or ``None`` if it was no longer dead.

    Raises :class:`ReplayRefused` if the row does not exist or cannot be replayed as stored.
    """
    outcome = replay_row(
        store,
        row_id,
        publisher(app),
        reason=reason,
        actor=actor,
        allow_redacted=allow_redacted,
        registered=registered_in(app),
        fits=fits_in(app),
    )
    if outcome.outcome == "missing":
        raise ReplayRefused(f"no dead letter {row_id}")
    if outcome.outcome == "refused":
        raise ReplayRefused(str(outcome.why))
    return outcome.task_id
