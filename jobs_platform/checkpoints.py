"""Checkpoints: a long job's small JSON progress, kept across its attempts.

``self.checkpoint(data)`` in a :class:`~jobs_platform.task.ReliableTask` stores ``data`` for
the running job; ``self.last_checkpoint()`` returns the last value stored (``None`` on a
first run). The value lives on the coordination Redis under the job's task id, which a
retry, a redelivery after a killed worker and a pool process lost to SIGKILL all keep. A
replay from the dead-letter table runs under a new id: the dead letter stores the job's last
checkpoint in its headers (:data:`HEADER`), the replay sends that header again and the
worker seeds ``last_checkpoint()`` from it. The key is deleted when the job succeeds.

Why Redis and not a SQL table: a checkpoint is written many times per run (every chunk of
rows), and the coordination Redis is already on every worker's path (rate limits, locks,
the dead-letter spool) at well under a millisecond per write; the one moment it must become
durable, when the job dies, the dead letter copies it into SQL. Its TTL
(``JOBS_CHECKPOINT_TTL``) is refreshed by every read and write, so it outlives any wait of a
retry ladder (each wait is at most ``JOBS_MAX_DELAY``, which a rule keeps below it).

A value holds what a job's arguments may hold (:mod:`jobs_platform.arguments`: JSON plus
kombu's typed datetime, Decimal, UUID...), at most ``JOBS_CHECKPOINT_MAX_BYTES`` of JSON;
anything else is refused at the ``checkpoint()`` call with :class:`CheckpointRefused`
(a PermanentError: retrying the same code would write the same value).
"""

from __future__ import annotations

import json
from typing import Any

from jobs_platform import arguments, coordination
from jobs_platform.errors import PermanentError

#: The header a dead letter stores the job's last checkpoint in, and a replay sends.
HEADER = "jobs_checkpoint"
#: The request attribute marking that this run read or wrote its checkpoint.
USED_ATTR = "jobs_checkpoint_used"
PREFIX = "jobs:checkpoint:"


class CheckpointRefused(PermanentError):
    """A checkpoint value that cannot be stored (too large, or not JSON)."""


def key(task_id: str) -> str:
    return f"{PREFIX}{task_id}"


def encode(task_name: str, data: Any, *, max_bytes: int) -> str:
    """``data`` as the stored JSON text; :class:`CheckpointRefused` naming what is wrong."""
    found = arguments.unsendable([data], {})
    if found is not None:
        where = found[0].replace("args[0]", "checkpoint", 1)
        raise CheckpointRefused(
            f"{task_name}: {where} is {found[1]}, which a checkpoint cannot hold: store JSON "
            "values (datetime, date, time, Decimal, UUID and bytes keep their type)"
        )
    text = arguments.dumps(data)
    size = len(text.encode())
    if size > max_bytes:
        raise CheckpointRefused(
            f"{task_name}: checkpoint of {size} bytes of JSON is over JOBS_CHECKPOINT_MAX_BYTES "
            f"({max_bytes}): store where the job is (a row number, a cursor), not its results"
        )
    return text


def decode(text: str | bytes | None) -> Any:
    if text is None:
        return None
    return arguments.from_stored(json.loads(text))


def save(app: Any, task_name: str, task_id: str, data: Any) -> None:
    settings = app.jobs_settings
    text = encode(task_name, data, max_bytes=int(settings.checkpoint_max_bytes))
    coordination.client(app).set(key(task_id), text, ex=int(settings.checkpoint_ttl))


def load(app: Any, task_id: str) -> Any:
    """The job's stored checkpoint (its TTL refreshed), or ``None``."""
    ttl = int(app.jobs_settings.checkpoint_ttl)
    return decode(coordination.client(app).getex(key(task_id), ex=ttl))


def peek(app: Any, task_id: str) -> Any:
    """The stored checkpoint, read only (a dead letter copies it); ``None`` if none."""
    return decode(coordination.client(app).get(key(task_id)))


def clear(app: Any, task_id: str) -> None:
    coordination.client(app).delete(key(task_id))
