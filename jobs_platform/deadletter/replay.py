"""Replay a dead letter through the normal dispatch, exactly once per row.

A replay sends the stored args/kwargs to the original queue with the original priority
and the job's custom headers (never Celery's protocol headers: see
:data:`PROTOCOL_HEADERS`), under a *new* task id, with a fresh attempt budget (no
retries counted, no error history) and the header ``jobs_replay_of=<row id>`` so that a
replay that dies again links back. The row moves ``dead -> replayed`` in the same
transaction that publishes (see :meth:`DeadLetterStore.replay`), so replaying the same
row twice enqueues once.
"""

from __future__ import annotations

from typing import Any

from celery.app.task import Context

from jobs_platform import history
from jobs_platform.clock import utc_iso
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.errors import JobsPlatformError

#: Headers that belong to the failed chain, not to the job: a replay starts afresh.
CHAIN_HEADERS = (history.ERRORS_HEADER, history.ENQUEUED_HEADER, history.REPLAY_OF_HEADER)
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
    if row["reason"] == "poison" and row["args"] is None:
        raise ReplayRefused(
            f"dead letter {row['id']} is a poison message with no decodable JSON payload"
        )
    if not row["task_name"]:
        raise ReplayRefused(f"dead letter {row['id']} has no task name")
    if row["redacted"] and not allow_redacted:
        raise ReplayRefused(
            f"dead letter {row['id']} had secrets redacted: a replay would send '***' "
            "instead of them (pass --allow-redacted if the task can cope)"
        )


def publisher(app: Any) -> Any:
    """``publish(row, new_task_id)`` for :meth:`DeadLetterStore.replay`."""

    def publish(row: dict[str, Any], new_task_id: str) -> None:
        headers = replay_headers(row["headers"])
        headers[history.REPLAY_OF_HEADER] = row["id"]
        options: dict[str, Any] = {
            "task_id": new_task_id,
            "queue": row["queue"] or None,
            "headers": headers,
        }
        if row["priority"] is not None:
            options["priority"] = row["priority"]
        task = app.tasks.get(row["task_name"])
        if task is not None:
            # ReliableTask.apply_async stamps a fresh jobs_enqueued_at; retries start at 0.
            task.apply_async(args=row["args"] or [], kwargs=row["kwargs"] or {}, **options)
        else:
            headers[history.ENQUEUED_HEADER] = utc_iso()
            app.send_task(
                row["task_name"], args=row["args"] or [], kwargs=row["kwargs"] or {}, **options
            )

    return publish


def replay(
    app: Any,
    store: DeadLetterStore,
    row_id: int,
    *,
    reason: str,
    actor: str,
    allow_redacted: bool = False,
) -> str | None:
    """Replay row ``row_id``: the new task id, or ``None`` if it was no longer dead."""
    row = store.get(row_id)
    if row is None:
        raise ReplayRefused(f"no dead letter {row_id}")
    if row["status"] != "dead":
        return None
    check_replayable(row, allow_redacted=allow_redacted)
    return store.replay(row_id, reason=reason, actor=actor, publish=publisher(app))
