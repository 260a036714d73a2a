"""A job's payload: the JSON of ``[args, kwargs]``, and how big it is (pure).

``JOBS_MAX_PAYLOAD_BYTES`` limits exactly this, wherever it is measured: at ``.delay()``,
in a bulk dispatch, and when a message that reached a queue anyway is screened.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: ``JOBS_MAX_PAYLOAD_BYTES`` when nothing else is set (1 MiB).
DEFAULT_MAX_BYTES = 1048576


def arguments_json(args: Any, kwargs: Any, *, dumps: Callable[[Any], str] = json.dumps) -> str:
    """The JSON of ``[args, kwargs]`` as ``dumps`` writes it (kombu's for what is sent, which
    also writes datetimes and UUIDs)."""
    return str(dumps([args if args is not None else [], kwargs or {}]))


def size_of(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (without encoding it when it is ASCII, as JSON mostly is)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def payload_size(args: Any, kwargs: Any, *, dumps: Callable[[Any], str] = json.dumps) -> int:
    """Bytes of the JSON of ``[args, kwargs]``: what ``JOBS_MAX_PAYLOAD_BYTES`` limits."""
    return size_of(arguments_json(args, kwargs, dumps=dumps))
