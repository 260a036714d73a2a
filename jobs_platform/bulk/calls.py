"""The calls of one bulk dispatch: read and checked, every one before anything is sent.

Each call gets the checks ``ReliableTask.apply_async`` makes (declared queue, delay within
``JOBS_MAX_DELAY``, the task's signature, JSON and ``JOBS_MAX_PAYLOAD_BYTES``, the business
key of a unique task). The first refused call stops the whole dispatch with its index in a
:class:`BulkDispatchError`; nothing has been published then.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any

from jobs_platform import dispatch
from jobs_platform.errors import DispatchError
from jobs_platform.flow import task as flow_task
from jobs_platform.idempotency import unique

#: Options that differ from call to call without changing anything else in the message.
PER_CALL_OPTIONS = frozenset({"countdown", "eta", "task_id"})


class BulkDispatchError(DispatchError):
    """A bulk dispatch that was refused, or that failed part-way (see the attributes).

    ``index`` is the refused call (nothing was published). After a broker failure,
    ``enqueued`` lists the calls (indexes) known to be in the broker, ``uncertain`` those
    written when the connection failed (each is either queued once or not at all), and
    ``unsent`` those never written; ``results`` holds the AsyncResult of every call that
    has one (``None`` for the unsent).
    """

    def __init__(
        self,
        message: str,
        *,
        index: int | None = None,
        enqueued: list[int] | None = None,
        uncertain: list[int] | None = None,
        unsent: list[int] | None = None,
        results: list[Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.index = index
        self.enqueued = enqueued or []
        self.uncertain = uncertain or []
        self.unsent = unsent or []
        self.results = results or []


@dataclasses.dataclass(slots=True)
class Call:
    """One call: what it runs with, how it is sent, and its task id (chosen here)."""

    index: int
    args: Any  # a tuple or a list, as given (it is shown as given: argsrepr)
    kwargs: dict[str, Any]
    #: The shared options, or (for a signature with options of its own) shared | own.
    options: dict[str, Any]
    task_id: str
    #: Given by the caller: always published, no unique-dispatch lock (as apply_async).
    explicit_id: bool
    #: The JSON of ``[args, kwargs]`` (what the payload limit measures; the body reuses it).
    payload: str = ""
    #: The unique-dispatch identity, when the task has ``unique_for``.
    identity: str | None = None


def new_ids(count: int) -> list[str]:
    """``count`` random (version 4) UUID strings, as ``celery.utils.uuid()`` makes them,
    from one read of the OS's random source (uuid4() reads it once per id)."""
    raw = bytearray(os.urandom(16 * count))
    ids = []
    for start in range(0, 16 * count, 16):
        raw[start + 6] = (raw[start + 6] & 0x0F) | 0x40  # version 4
        raw[start + 8] = (raw[start + 8] & 0x3F) | 0x80  # RFC 4122 variant
        h = raw[start : start + 16].hex()
        ids.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return ids


def read(task: Any, items: Iterable[Any], shared: dict[str, Any], *, form: str) -> list[Call]:
    """Every item as a checked :class:`Call`; raises :class:`BulkDispatchError` on the first
    refused one. ``form`` is ``"delay"`` (items are argument tuples or keyword dicts) or
    ``"apply_async"`` (``(args, kwargs)`` pairs or signatures of ``task``)."""
    items = list(items)
    try:
        dispatch.check_options(task, shared)
    except Exception as exc:
        raise BulkDispatchError(
            f"{task.name}: options refused, nothing was enqueued: {_reason(task, exc)}"
        ) from exc
    shared = dispatch.versioned(task, shared)
    ids = new_ids(len(items))
    calls: list[Call] = []
    for index, item in enumerate(items):
        try:
            args, kwargs, own = _unpack(task, item, form)
            options = dispatch.versioned(task, {**shared, **own}) if own else shared
            if own:
                dispatch.check_options(task, options)
            payload = check_arguments(task, args, kwargs)
            if task.spec.fairness_key is not None:
                options = flow_task.with_fairness_key(task, args, kwargs, options)
            given = options.get("task_id")
            call = Call(
                index, args, kwargs, options, str(given or ids[index]), bool(given), payload
            )
            if task.spec.unique_for_s is not None and not given:
                call.identity = unique.identity_of(task, args, kwargs)
        except Exception as exc:
            raise refused(task, index, len(items), exc) from exc
        calls.append(call)
    return calls


def refused(task: Any, index: int, count: int, exc: Exception) -> BulkDispatchError:
    return BulkDispatchError(
        f"{task.name}: call {index} of {count} refused, nothing was enqueued: {_reason(task, exc)}",
        index=index,
    )


def _reason(task: Any, exc: Exception) -> str:
    """The refusal's message without the task name it starts with (said once already)."""
    reason = str(exc) or type(exc).__name__
    prefix = f"{task.name}: "
    return reason[len(prefix) :] if reason.startswith(prefix) else reason


def _unpack(task: Any, item: Any, form: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """``(args, kwargs, own options)`` of one item."""
    if form == "delay":
        if isinstance(item, Mapping):
            return (), dict(item), {}
        if isinstance(item, tuple | list):
            return tuple(item), {}, {}
        raise DispatchError(
            f"expected a tuple of positional arguments or a dict of keyword arguments, got "
            f"{type(item).__name__} (for one argument write (x,))"
        )
    if _is_signature(item):
        if item.task != task.name:
            raise DispatchError(f"a signature of {item.task!r}, not of {task.name!r}")
        return tuple(item.args or ()), dict(item.kwargs or {}), dict(item.options or {})
    if isinstance(item, tuple | list) and len(item) == 2:
        args, kwargs = item
        if (args is None or isinstance(args, tuple | list)) and (
            kwargs is None or isinstance(kwargs, Mapping)
        ):
            return args if args is not None else (), dict(kwargs or {}), {}
    raise DispatchError(
        "expected an (args, kwargs) pair or a signature of the task "
        f"(task.s(...)), got {type(item).__name__}"
    )


def _is_signature(item: Any) -> bool:
    from celery.canvas import Signature

    return isinstance(item, Signature)


def check_arguments(task: Any, args: Any, kwargs: Mapping[str, Any]) -> str:
    """The task's signature (Celery's ``typing`` check, which the single path leaves to
    Celery's ``apply_async``), then JSON and the payload limit; the JSON of
    ``[args, kwargs]`` (the message body reuses it)."""
    if task.typing:
        header = getattr(task, "__header__", None)
        if header is not None:
            header(*args, **kwargs)
    return dispatch.encode_arguments(task, args, kwargs)
