"""Per-entry policies of a recurring job: overlap and catch-up (pure: no Celery, no Redis).

An entry of Celery's ``beat_schedule`` states its policies in its ``options`` dict, next to
Celery's own publishing options (``queue``, ``priority``, ...)::

    "nightly-report": {
        "task": "tasks.reports.nightly_report",
        "schedule": crontab(minute=0, hour=2),
        "options": {"overlap": "skip", "catch_up": 1, "grace": 60},
    }

``overlap``  ``"skip"`` (default): a slot comes due while the entry's previous run is still
             queued or running, so the slot is skipped (logged and counted); ``"allow"``: it
             is sent anyway. Skip is the default because a run slower than its interval would
             otherwise pile up in the queue without bound, and two runs of one job at once
             are rarely what the author thought through.
``catch_up`` how many of the slots missed while no beat ran are sent late (newest first
             kept, sent oldest first): ``1`` (default), ``0`` (none), ``N`` (at most N). A
             beat that was down for a day never sends a day's worth of slots.
``grace``    seconds (default 60): the newest due slot is *on time*, and sent whatever
             ``catch_up`` says, when beat reaches it at most this late; later, it counts as
             missed.

:func:`plan` decides, from the slots that are due, which ones to send.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping, Sequence
from typing import Any

from jobs_platform.errors import ConfigError

SKIP = "skip"
ALLOW = "allow"
OVERLAPS = (SKIP, ALLOW)
DEFAULT_OVERLAP = SKIP
DEFAULT_CATCH_UP = 1
DEFAULT_GRACE_S = 60.0
#: More missed slots than this sent at once is a flood, whatever the entry asks for.
MAX_CATCH_UP = 100
#: The keys of an entry's ``options`` read here; they are removed before publishing.
OPTION_KEYS = ("overlap", "catch_up", "grace")


@dataclasses.dataclass(frozen=True)
class EntryPolicy:
    """How one entry treats overlapping runs and missed slots."""

    overlap: str = DEFAULT_OVERLAP
    catch_up: int = DEFAULT_CATCH_UP
    grace_s: float = DEFAULT_GRACE_S

    def __post_init__(self) -> None:
        check_policy(self.overlap, self.catch_up, self.grace_s, entry=None)


def check_policy(overlap: Any, catch_up: Any, grace_s: Any, *, entry: str | None) -> None:
    where = f"beat entry {entry!r}: " if entry is not None else ""
    if overlap not in OVERLAPS:
        raise ConfigError(f"{where}overlap must be one of {OVERLAPS}, got {overlap!r}")
    if isinstance(catch_up, bool) or not isinstance(catch_up, int):
        raise ConfigError(f"{where}catch_up must be an int (0 = none), got {catch_up!r}")
    if not 0 <= catch_up <= MAX_CATCH_UP:
        raise ConfigError(f"{where}catch_up must be between 0 and {MAX_CATCH_UP}, got {catch_up}")
    if (
        isinstance(grace_s, bool)
        or not isinstance(grace_s, int | float)
        or not math.isfinite(grace_s)
        or grace_s < 0
    ):
        raise ConfigError(f"{where}grace must be a finite number of seconds >= 0, got {grace_s!r}")


def split_options(
    entry: str, options: Mapping[str, Any] | None
) -> tuple[EntryPolicy, dict[str, Any]]:
    """The entry's policy and the options left for ``apply_async``; bad values raise
    ConfigError naming the entry (beat refuses to start)."""
    rest = dict(options or {})
    overlap = rest.pop("overlap", DEFAULT_OVERLAP)
    catch_up = rest.pop("catch_up", DEFAULT_CATCH_UP)
    grace_s = rest.pop("grace", DEFAULT_GRACE_S)
    check_policy(overlap, catch_up, grace_s, entry=entry)
    return EntryPolicy(overlap, catch_up, float(grace_s)), rest


@dataclasses.dataclass(frozen=True)
class Plan:
    """What to do with the due slots of one entry."""

    #: Slots to send, oldest first.
    send: tuple[dt.datetime, ...]
    #: Due slots the catch-up policy drops (counted as skipped, reason ``missed``).
    missed: int


def plan(
    newest_due: Sequence[dt.datetime], due_count: int, now: dt.datetime, policy: EntryPolicy
) -> Plan:
    """Which due slots to send.

    ``newest_due`` are the newest due slots, oldest first (at least ``catch_up + 1`` of
    them when that many are due); ``due_count`` how many are due in all. Only the newest
    due slot can be on time (every older one was overtaken by its successor); it is on
    time if ``now`` is within ``grace`` of it. The others are missed: the newest
    ``catch_up`` of them are sent, the rest dropped.
    """
    if due_count < len(newest_due):
        raise ValueError(f"due_count {due_count} < {len(newest_due)} slots given")
    if not newest_due:
        return Plan((), 0)
    newest = newest_due[-1]
    on_time = (now - newest).total_seconds() <= policy.grace_s
    late = list(newest_due[:-1] if on_time else newest_due)
    kept = late[len(late) - policy.catch_up :] if policy.catch_up else []
    send = (*kept, newest) if on_time else tuple(kept)
    return Plan(tuple(send), due_count - len(send))
