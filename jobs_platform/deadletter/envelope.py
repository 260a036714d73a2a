"""What an item in a queue list must be before kombu and Celery read it (pure: no Celery).

kombu's Redis transport pops an item, parses it as JSON and indexes it as a message
envelope (``properties.delivery_tag``, ``properties.delivery_info``, ``headers``,
``body`` in its ``body_encoding``) without checking any of it; an item that is not one
stops the worker or is lost (:mod:`.rawpoison` acts on the verdicts given here).

- :func:`read_item`: the parsed item, or why it is not JSON;
- :func:`envelope_problem` / :func:`body_problem`: what keeps a parsed item from being a
  kombu envelope;
- :func:`task_problem`: what Celery's consumer would fail on in a task message;
- :func:`oversize`: ``JOBS_MAX_PAYLOAD_BYTES`` measures the JSON of a message's
  ``[args, kwargs]`` (:func:`jobs_platform.payload.payload_size`), the same at dispatch and
  in the worker.

The error types are stable names (``jobs_platform.NotJSON``, ...) so that ``dlq stats``
groups each kind of bad input together.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from jobs_platform.payload import payload_size

#: The item is not JSON (garbage, or JSON cut short).
NOT_JSON = "jobs_platform.NotJSON"
#: JSON, but not a message envelope kombu can read.
NOT_AN_ENVELOPE = "jobs_platform.NotAnEnvelope"
#: An envelope whose body does not decode with its ``body_encoding``.
BAD_BODY_ENCODING = "jobs_platform.BadBodyEncoding"
#: Arguments larger than ``JOBS_MAX_PAYLOAD_BYTES``.
PAYLOAD_TOO_LARGE = "jobs_platform.PayloadTooLarge"
#: An envelope Celery's consumer could not turn into a task request.
UNREADABLE_MESSAGE = "jobs_platform.UnreadableMessage"

#: How much of an offending value an error message quotes.
_QUOTE = 80


@dataclasses.dataclass(frozen=True)
class Refusal:
    """Why an item or a message cannot run: a stable type and a message for people."""

    error_type: str
    error: str


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


def read_item(item: bytes, *, loads: Callable[[str], Any] = json.loads) -> Any:
    """The item parsed as kombu parses it (invalid UTF-8 replaced), or a :class:`Refusal`.

    ``loads`` is the transport's own JSON decoder: whatever it raises (a syntax error, a
    nesting too deep, a type marker it does not know) makes the item unreadable.
    """
    try:
        return loads(item.decode("utf-8", errors="replace"))
    except Exception as exc:  # any failure of the decoder is the item's
        return Refusal(NOT_JSON, f"not JSON ({type(exc).__name__}: {_quote(str(exc))[1:-1]})")


def _is_text(value: Any) -> bool:
    return value is None or isinstance(value, str)


def envelope_problem(payload: Any) -> str | None:
    """What keeps ``payload`` (a parsed item) from being a message kombu can deliver, or None.

    The fields checked are those kombu and its Redis acknowledgement read unguarded: an
    object with ``properties`` holding a ``delivery_tag`` string and a ``delivery_info``
    with ``exchange`` and ``routing_key`` strings; ``headers`` an object when present;
    ``body``, ``body_encoding``, ``content-type`` and ``content-encoding`` strings or null.
    Whether the body decodes is left to kombu's own codec (:mod:`.rawpoison`).
    """
    if not isinstance(payload, dict):
        return f"a JSON {type(payload).__name__} is not a message envelope"
    properties = payload.get("properties")
    if not isinstance(properties, dict):
        return f"no 'properties' object (got {_quote(properties)})"
    tag = properties.get("delivery_tag")
    if not isinstance(tag, str) or not tag:
        return f"no 'properties.delivery_tag' string (got {_quote(tag)})"
    info = properties.get("delivery_info")
    if not isinstance(info, dict):
        return f"no 'properties.delivery_info' object (got {_quote(info)})"
    for key in ("exchange", "routing_key"):
        if not isinstance(info.get(key), str):
            return f"no 'properties.delivery_info.{key}' string (got {_quote(info.get(key))})"
    if not isinstance(payload.get("headers", {}), dict):
        return f"'headers' is not an object (got {_quote(payload.get('headers'))})"
    for key in ("body", "content-type", "content-encoding"):
        if not _is_text(payload.get(key)):
            return f"'{key}' is not a string (got {_quote(payload.get(key))})"
    encoding = properties.get("body_encoding")
    if not _is_text(encoding):
        return f"'properties.body_encoding' is not a string (got {_quote(encoding)})"
    return None


def body_problem(payload: dict[str, Any]) -> str | None:
    """A ``base64`` body (kombu's encoding on Redis) that is not strictly base64, or None.

    kombu's decoder skips characters outside the alphabet, so garbage can decode to a few
    stray bytes; kombu itself always writes the strict form.
    """
    body = payload.get("body")
    if payload["properties"].get("body_encoding") == "base64" and body:
        try:
            base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError) as exc:
            return f"body is not base64 ({exc})"
    return None


#: The body was not decoded (not JSON, compressed) or did not decode.
UNDECODED = object()


def decode_body(body: bytes, *, json_body: bool, loads: Callable[[bytes], Any] = json.loads) -> Any:
    """A JSON message body decoded, or :data:`UNDECODED` (never tries anything but JSON)."""
    if not json_body:
        return UNDECODED
    try:
        return loads(body)
    except Exception:  # Celery's own decoding reports it (a DecodeError poison letter)
        return UNDECODED


def oversize(
    body: bytes, decoded: Any, *, max_bytes: int, dumps: Callable[[Any], str] = json.dumps
) -> int | None:
    """The size of a message's arguments when it is over ``max_bytes``, else None.

    Celery's body is ``[args, kwargs, options]``: a body within the limit passes as it is.
    A larger decoded one is measured as :func:`payload_size` measures at dispatch (its
    options, such as a chain, do not count); any other body that large (not JSON,
    compressed, not in Celery's shape) is over the limit by its own size.
    """
    if len(body) <= max_bytes:
        return None
    if isinstance(decoded, list) and len(decoded) >= 2:
        size = payload_size(decoded[0], decoded[1], dumps=dumps)
        return size if size > max_bytes else None
    return len(body)


def _is_limit(value: Any) -> bool:
    return value is None or (
        isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    )


def task_problem(headers: dict[str, Any], decoded: Any) -> str | None:
    """What Celery's consumer would fail on in a task message (protocol 2), or None.

    The headers it reads unguarded while it turns a message into a request, and a decoded
    body that is not ``[args (list), kwargs (object), options (object or null)]``. Celery
    guards ``eta`` and ``expires`` itself (an InvalidTaskError, recorded by the consumer).
    """
    if "task" not in headers:
        return None  # not protocol 2: Celery's "unknown message" path records it
    for key in ("task", "id"):
        if not isinstance(headers.get(key), str) or not headers[key]:
            return f"header {key!r} is not a non-empty string (got {_quote(headers.get(key))})"
    for key in ("shadow", "root_id", "parent_id", "group"):
        if not _is_text(headers.get(key)):
            return f"header {key!r} is not a string (got {_quote(headers.get(key))})"
    retries = headers.get("retries")
    if retries is not None and not (_is_limit(retries) and isinstance(retries, int)):
        return f"header 'retries' is not a count (got {_quote(retries)})"
    limits = headers.get("timelimit")
    if limits is not None and not (
        isinstance(limits, list | tuple) and len(limits) == 2 and all(map(_is_limit, limits))
    ):
        return f"header 'timelimit' is not [hard, soft] seconds (got {_quote(limits)})"
    if decoded is UNDECODED:
        return None
    if not (isinstance(decoded, list) and len(decoded) == 3):
        return f"body is not [args, kwargs, options] (got {_quote(decoded)})"
    args, kwargs, options = decoded
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return f"arguments are not a list and an object (got {_quote(args)}, {_quote(kwargs)})"
    if not (options is None or isinstance(options, dict)):
        return f"body options are not an object (got {_quote(options)})"
    return None
