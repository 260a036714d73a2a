"""A batch's members, checked all together and then published through the bulk path.

:func:`plan` groups the signatures by task and reads each group with bulk dispatch's own
checks (:func:`jobs_platform.bulk.calls.read`): declared queue, delay, signature, JSON,
payload size, plus the batch's rules (:func:`jobs_platform.rules.check_batch_member`).
The first refusal refuses the whole batch, before anything is written or sent.
:func:`publish` then sends each group with :func:`jobs_platform.bulk.publish.publish`, every
message carrying the batch header (:data:`jobs_platform.history.BATCH_HEADER`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from jobs_platform import history, rules
from jobs_platform.bulk import publish as publishing
from jobs_platform.bulk.calls import BulkDispatchError, Call, read
from jobs_platform.errors import DispatchError


@dataclasses.dataclass
class Group:
    """The calls of one task, with each one's index in the batch's list."""

    task: Any
    calls: list[Call]
    positions: list[int]


def plan(
    app: Any, signatures: Sequence[Any], batch_id: str, *, task_ids: Sequence[str] | None = None
) -> list[Group]:
    """Every signature as a checked call of its task, grouped by task (in first-seen order);
    raises :class:`BulkDispatchError` (with the signature's ``index``) on the first refusal."""
    by_task: dict[str, tuple[Any, list[Any], list[int]]] = {}
    seen: set[str] = set()
    for index, sig in enumerate(signatures):
        task = _task_of(app, sig, index)
        rules.check_batch_member(task, index=index)
        sig = _with_batch(sig, batch_id, None if task_ids is None else task_ids[index])
        given = (sig.options or {}).get("task_id")
        if given is not None:
            if given in seen:
                raise BulkDispatchError(
                    f"batch member {index} ({task.name}): task id {given} is given to two "
                    "members; each member is counted by its id; nothing was enqueued",
                    index=index,
                )
            seen.add(given)
        entry = by_task.setdefault(task.name, (task, [], []))
        entry[1].append(sig)
        entry[2].append(index)
    groups = []
    shared = {"headers": {history.BATCH_HEADER: batch_id}}
    for task, sigs, positions in by_task.values():
        try:
            calls = read(task, sigs, shared, form="apply_async")
        except BulkDispatchError as exc:
            at = positions[exc.index] if exc.index is not None else None
            raise BulkDispatchError(
                f"batch member {at}: {exc}" if at is not None else str(exc), index=at
            ) from exc
        groups.append(Group(task, calls, positions))
    return groups


def publish(groups: Iterable[Group], count: int) -> list[Any]:
    """Publish every group; the AsyncResults in the batch's order. A broker failure raises
    the bulk's :class:`BulkDispatchError`, its indexes those of the batch."""
    results: list[Any] = [None] * count
    for group in groups:
        part: list[Any] = [None] * len(group.calls)
        try:
            publishing.publish(group.task, group.calls, part)
        except BulkDispatchError as exc:
            exc.enqueued = [group.positions[i] for i in exc.enqueued]
            exc.uncertain = [group.positions[i] for i in exc.uncertain]
            exc.unsent = [group.positions[i] for i in exc.unsent]
            raise
        for i, result in enumerate(part):
            results[group.positions[i]] = result
    return results


def task_ids(groups: Iterable[Group]) -> list[tuple[int, str, str]]:
    """``(index, task id, task name)`` of every call."""
    return [
        (group.positions[i], call.task_id, group.task.name)
        for group in groups
        for i, call in enumerate(group.calls)
    ]


def _task_of(app: Any, sig: Any, index: int) -> Any:
    name = getattr(sig, "task", None)
    if not isinstance(sig, dict) or not isinstance(name, str):
        raise BulkDispatchError(
            f"batch member {index} must be a signature (task.s(...)), got "
            f"{type(sig).__name__}; nothing was enqueued",
            index=index,
        )
    task = app.tasks.get(name)
    if task is None:
        raise BulkDispatchError(
            f"batch member {index}: task {name!r} is not declared in this app; nothing was "
            "enqueued",
            index=index,
        )
    return task


def _with_batch(sig: Any, batch_id: str, task_id: str | None) -> Any:
    """``sig`` with the batch header in its own headers, if it has any (its own options
    replace the shared ones), and with ``task_id`` if one is chosen."""
    options = sig.options or {}
    own = options.get("headers")
    if own is None and task_id is None:
        return sig
    sig = sig.clone()
    if own is not None:
        if not isinstance(own, dict):
            raise DispatchError(f"{sig.task}: headers must be a dict, got {type(own).__name__}")
        sig.options["headers"] = {**own, history.BATCH_HEADER: batch_id}
    if task_id is not None:
        sig.options["task_id"] = task_id
        sig.options.setdefault("headers", {history.BATCH_HEADER: batch_id})
    return sig
