"""A dead letter as plain data, before it reaches the table (pure: no Celery, no database).

The same :class:`DeadLetter` travels through the durable spool as JSON and becomes one row
of ``dead_letter_jobs``. Its :attr:`~DeadLetter.dedupe_key` identifies one *attempt chain*
(the task id plus the time the job was first enqueued, which retries carry along), so the
same failure reported twice is stored once.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
from collections.abc import Collection, Mapping
from typing import Any

from jobs_platform import arguments
from jobs_platform.clock import as_utc, utcnow

REDACTED = "***"

#: Length limits of the ``dead_letter_jobs`` string columns that :meth:`DeadLetter.row`
#: fills: values taken from a message (a poison message can carry anything) are cut to
#: fit. Kept here so this module stays free of SQLAlchemy; a unit test holds it equal to
#: the model's (tests/unit/deadletter/test_rules.py).
COLUMN_LENGTHS: dict[str, int] = {
    "dedupe_key": 64,
    "task_id": 255,
    "task_name": 255,
    "queue": 255,
    "exchange": 255,
    "routing_key": 255,
    "raw_body_encoding": 16,
    "content_type": 255,
    "content_encoding": 64,
    "reason": 16,
    "error_type": 255,
    "fingerprint": 16,
    "worker": 255,
    "status": 16,
}
#: PostgreSQL INTEGER.
_INT_MAX = 2**31 - 1

_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_HEX = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.I)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def normalise_message(message: str) -> str:
    """``message`` with ids, numbers and quoted values replaced, so similar errors group."""
    text = _UUID.sub("<id>", message)
    text = _HEX.sub("<id>", text)
    text = _QUOTED.sub("<str>", text)
    text = _NUMBER.sub("<n>", text)
    return " ".join(text.split())[:500]


def fingerprint(
    task_name: str, error_type: str, message: str, *, status: int | None, reason: str
) -> str:
    """A short stable hash of one failure *cause* (for grouping and bulk replay by cause).

    The basis is task + exception type + HTTP status + why the job died + normalised
    message. Status and reason are kept apart from the message because normalising turns
    every number into ``<n>``: without them a 404 (``permanent``) and a 503 (``exhausted``)
    of the same task would be one group, and replaying that group would replay both.
    Rows stored before status and reason joined the basis keep their old fingerprint.
    """
    code = "" if status is None else str(status)
    basis = "\x1f".join((task_name, error_type, code, reason, normalise_message(message)))
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


def redact(value: Any, keys: Collection[str]) -> tuple[Any, bool]:
    """``value`` with every mapping entry whose key is in ``keys`` (case-insensitive) masked.

    Returns the copy and whether anything was masked. Positional values cannot be matched
    by name, so only keyword arguments and nested mappings are redacted.
    """
    lowered = {k.lower() for k in keys}

    def walk(item: Any) -> tuple[Any, bool]:
        if isinstance(item, Mapping):
            out: dict[Any, Any] = {}
            hit = False
            for key, sub in item.items():
                if isinstance(key, str) and key.lower() in lowered:
                    out[key], hit = REDACTED, True
                else:
                    out[key], sub_hit = walk(sub)
                    hit = hit or sub_hit
            return out, hit
        if isinstance(item, list | tuple):
            pairs = [walk(sub) for sub in item]
            return [p[0] for p in pairs], any(p[1] for p in pairs)
        return item, False

    return walk(value)


def clean_text(value: str) -> str:
    """``value`` without NUL characters and lone surrogates (neither PostgreSQL text nor
    JSONB can hold them)."""
    if "\x00" in value:
        value = value.replace("\x00", "")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def clean_json(value: Any) -> Any:
    """A JSON-storable copy of ``value``: strings cleaned (keys too), other scalars kept."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {
            (clean_text(k) if isinstance(k, str) else k): clean_json(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    return value


def small_int_or_none(value: Any) -> int | None:
    """An INTEGER column value from ``value`` (int or digit string in range), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if isinstance(value, int) and -_INT_MAX - 1 <= value <= _INT_MAX:
        return value
    return None


def row_id_or_none(value: Any) -> int | None:
    """A row id from a header value (int or digit string), else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


def parse_time(value: Any) -> dt.datetime | None:
    """An aware UTC datetime from an ISO string or datetime (naive values are UTC)."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value))
        except ValueError:
            return None
    return as_utc(moment)


@dataclasses.dataclass
class DeadLetter:
    """Everything stored about one dead job (see :mod:`jobs_platform.deadletter.model`)."""

    reason: str
    task_id: str | None
    task_name: str
    queue: str
    errors: list[dict[str, Any]]
    failed_at: dt.datetime
    args: Any = None
    kwargs: Any = None
    headers: dict[str, Any] | None = None
    priority: int | None = None
    exchange: str | None = None
    routing_key: str | None = None
    redacted: bool = False
    raw_body: str | None = None
    raw_body_encoding: str | None = None
    content_type: str | None = None
    content_encoding: str | None = None
    attempts: int = 0
    traceback: str | None = None
    worker: str | None = None
    enqueued_at: dt.datetime | None = None
    replay_of: int | None = None
    #: Distinguishes chains that share a task id (first-enqueued time, or the delivery tag).
    chain: str = ""

    @property
    def error_type(self) -> str:
        return str(self.errors[-1].get("type", "")) if self.errors else ""

    @property
    def error_message(self) -> str:
        return str(self.errors[-1].get("message", "")) if self.errors else ""

    @property
    def http_status(self) -> int | None:
        """The HTTP status of the final error (its ``status`` entry), if it had one."""
        status = self.errors[-1].get("status") if self.errors else None
        return status if isinstance(status, int) and not isinstance(status, bool) else None

    @property
    def fingerprint(self) -> str:
        return fingerprint(
            self.task_name,
            self.error_type,
            self.error_message,
            status=self.http_status,
            reason=self.reason,
        )

    @property
    def dedupe_key(self) -> str:
        basis = f"{self.task_id or ''}\x1f{self.chain}"
        return hashlib.sha256(basis.encode()).hexdigest()

    def redact(self, keys: Collection[str]) -> DeadLetter:
        """A copy with ``keys`` masked in args, kwargs and headers."""
        args, hit_a = redact(self.args, keys)
        kwargs, hit_k = redact(self.kwargs, keys)
        headers, hit_h = redact(self.headers, keys)
        return dataclasses.replace(
            self,
            args=args,
            kwargs=kwargs,
            headers=headers,
            redacted=self.redacted or hit_a or hit_k or hit_h,
        )

    def row(self) -> dict[str, Any]:
        """Column values for ``dead_letter_jobs``, made storable.

        A message can carry anything, and a value the database refuses would keep its dead
        letter out of the table: strings are cut to their column's length, NUL characters
        (which neither PostgreSQL text nor JSONB accept) and lone surrogates are removed,
        and integers that are not integers become ``None`` (``attempts``: 0).
        """
        values = dataclasses.asdict(self)
        del values["chain"]
        values.update(
            dedupe_key=self.dedupe_key,
            fingerprint=self.fingerprint,
            error_type=self.error_type,
            error_message=self.error_message,
            status="dead",
        )
        for name in ("task_name", "queue"):
            if not isinstance(values[name], str):
                values[name] = "" if values[name] is None else str(values[name])
        for name, value in values.items():
            if isinstance(value, str):
                value = clean_text(value)
                limit = COLUMN_LENGTHS.get(name)
                values[name] = value[:limit] if limit else value
        for name in ("args", "kwargs", "headers", "errors"):
            # Typed values as the message carried them (a letter built by hand may hold any).
            values[name] = clean_json(arguments.to_stored(values[name]))
        values["priority"] = small_int_or_none(values["priority"])
        values["replay_of"] = row_id_or_none(values["replay_of"])
        values["attempts"] = small_int_or_none(values["attempts"]) or 0
        values["redacted"] = bool(values["redacted"])
        return values

    def to_json(self) -> str:
        data = dataclasses.asdict(self)
        for name in ("failed_at", "enqueued_at"):
            value = data[name]
            data[name] = value.isoformat() if value is not None else None
        # Arguments are stored as sent (kombu's type tags), never as a repr: see arguments.py.
        return arguments.storable_json(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> DeadLetter:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in known}
        data["failed_at"] = parse_time(data.get("failed_at")) or utcnow()
        data["enqueued_at"] = parse_time(data.get("enqueued_at"))
        return cls(**data)
