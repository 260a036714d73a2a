"""What a job's arguments may hold: one rule wherever they are sent, stored or sent again.

A job travels as kombu's JSON (Celery's ``json`` serializer). Besides JSON's own values (str,
int, float, bool, None, lists, objects with string keys), kombu's JSON carries
``datetime``, ``date``, ``time``, ``Decimal``, ``UUID`` and ``bytes`` tagged with their type
(``{"__type__": "datetime", "__value__": "2026-01-02T03:04:05+00:00"}``) and the worker
decodes them back. The platform holds that everywhere:

- those values **round-trip with their type**: to the task, into a dead letter (its
  ``args``/``kwargs``/``headers`` are stored in that tagged form, as they were sent, never
  as a repr: :func:`to_stored`), and back out of a replay (:func:`from_stored`), a bulk
  dispatch or a beat entry;
- anything else (a set, a frozenset, an object, a mapping key that is not a string,
  number, bool or None) is **refused at dispatch** (``.delay()``, ``delay_many``, a beat
  entry when beat starts), naming the argument and where in it the value sits
  (:func:`refusal`: ``kwargs['tags']``, ``args[0]['items'][2]``).

As in any JSON, a tuple arrives as a list and a numeric mapping key as a string.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from kombu.utils.json import JSONEncoder
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

#: The values kombu's JSON tags with their type and decodes back (besides JSON's own).
TYPED: tuple[type, ...] = (dt.datetime, dt.date, dt.time, Decimal, uuid.UUID, bytes)
_NATIVE = (str, int, float, bool, type(None))
_KEY_TYPES = (str, int, float, bool, type(None))
_CARRIED = _NATIVE + TYPED
_NO_KEY = object()
#: The tag :func:`to_stored` gives a value that could not be encoded (never a repr: its type
#: only); a replay refuses a row that holds one.
UNSTORABLE = "jobs_platform.unstorable"
_TAGS = frozenset({"__type__", "__value__"})


def dumps(value: Any, **kwargs: Any) -> str:
    """``value`` as kombu's JSON (what Celery sends): raises TypeError for what it cannot."""
    return str(kombu_dumps(value, **kwargs))


# -- dispatch: refuse what would not arrive as sent -----------------------------------------


def _items(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for key, sub in value.items():
            yield f"[{key!r}]", sub
    elif isinstance(value, list | tuple):
        for index, sub in enumerate(value):
            yield f"[{index}]", sub


def unsendable(args: Any, kwargs: Any) -> tuple[str, str] | None:
    """``(path, what)`` of the first value in ``args``/``kwargs`` kombu's JSON cannot carry
    (``("kwargs['tags']", "a set")``), or ``None`` when every value can."""
    stack: list[tuple[str, Any]] = [("kwargs", kwargs or {}), ("args", list(args or ()))]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _CARRIED):
            continue
        if isinstance(value, Mapping):
            bad = next((k for k in value if not isinstance(k, _KEY_TYPES)), _NO_KEY)
            if bad is not _NO_KEY:
                return path, f"a mapping with a key of type {type(bad).__name__} ({bad!r:.40})"
        if isinstance(value, Mapping | list | tuple):
            stack.extend(reversed([(path + step, sub) for step, sub in _items(value)]))
            continue
        try:
            dumps(value)  # an object with __json__, or a type registered with kombu
        except (TypeError, ValueError):
            return path, _a(type(value).__name__)
    return None


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def refusal(task_name: str, args: Any, kwargs: Any, exc: BaseException | None = None) -> str:
    """Why ``args``/``kwargs`` cannot be sent, naming the argument (for a DispatchError)."""
    found = unsendable(args, kwargs)
    where = f"argument {found[0]} is {found[1]}" if found else f"the arguments: {exc}"
    return (
        f"{task_name}: {where}, which a job's JSON cannot carry: pass "
        "JSON values (a list for a set, IDs for objects); datetime, date, time, Decimal, UUID "
        "and bytes arrive as their own type"
    )


# -- dead letters: stored as sent, read back with their type ---------------------------------


class _Storable(JSONEncoder):  # type: ignore[misc]
    """kombu's encoder (the same tags as the message had); a value it cannot encode becomes
    a tag naming its type, so a dead letter is never lost over it, nor stored as a repr."""

    def default(self, o: Any) -> Any:
        try:
            return super().default(o)
        except TypeError:
            kind = type(o)
            return {"__type__": UNSTORABLE, "__value__": f"{kind.__module__}.{kind.__qualname__}"}


def storable_json(value: Any, **kwargs: Any) -> str:
    """``value`` as JSON text with kombu's type tags (see :class:`_Storable`); never raises
    for a value's type."""
    return str(kombu_dumps(value, cls=_Storable, **kwargs))


def to_stored(value: Any) -> Any:
    """``value`` as plain JSON data, typed values tagged as the message carried them."""
    if isinstance(value, _NATIVE):
        return value
    return json.loads(storable_json(value))


def unstorable_in(value: Any) -> str | None:
    """The type name of a value :func:`to_stored` could not encode, if ``value`` holds one."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            if item.keys() == _TAGS and item["__type__"] == UNSTORABLE:
                return str(item["__value__"])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def from_stored(value: Any) -> Any:
    """Stored data with its typed values decoded (what a replay sends, as first sent).

    Raises ValueError for a tag kombu does not know (:data:`UNSTORABLE` among them).
    """
    if isinstance(value, _NATIVE):
        return value
    return kombu_loads(json.dumps(value))
