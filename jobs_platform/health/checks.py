"""The health checks: each a small function returning a :class:`Check`; verdicts are pure.

Each check is bounded by its own timeouts; the runner (:mod:`.runner`) bounds the whole
run. A check never raises: an unexpected error is its ``FAIL`` line (:func:`timed`), with
every password masked and on one line.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import redis

from jobs_platform import brokers, history
from jobs_platform.brokers.interface import QueueState
from jobs_platform.coordination import lease
from jobs_platform.deadletter import spool as spool_keys
from jobs_platform.deadletter.record import parse_time
from jobs_platform.flow import state as flow_state
from jobs_platform.flow.breaker import Reading
from jobs_platform.urls import masked

#: Beat may be this late on top of twice its expected tick gap (start-up, a slow Redis).
BEAT_SLACK_S = 10.0
#: A spooled dead letter may wait this long on top of two drain intervals: the capture
#: path makes up to JOBS_DLQ_WRITE_ATTEMPTS attempts (a connect timeout each) before
#: leaving it to the drainer.
SPOOL_SLACK_S = 30.0
#: Longest detail kept on a line (a database error can be a page long).
MAX_DETAIL = 300


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    elapsed_s: float = 0.0
    #: Passing, but a person should know (an open circuit breaker): printed ``WARN``.
    warn: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "warn": self.warn,
            "detail": self.detail,
            "elapsed_s": round(self.elapsed_s, 4),
        }


def one_line(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` on one line, cut to :data:`MAX_DETAIL`, with every secret replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = " ".join(text.split())
    return text if len(text) <= MAX_DETAIL else text[: MAX_DETAIL - 3] + "..."


def passwords(*urls: str) -> list[str]:
    """The passwords in ``urls`` (to be masked wherever an error message repeats them)."""
    import urllib.parse

    found: list[str] = []
    for url in urls:
        try:
            password = urllib.parse.urlsplit(url).password
        except ValueError:
            continue
        if password:
            found.extend({password, urllib.parse.unquote(password)})
    return found


def describe_error(exc: BaseException) -> str:
    """The driver's own message when there is one (SQLAlchemy wraps it with a page of text)."""
    inner = getattr(exc, "orig", None) or exc
    return f"{type(inner).__name__}: {inner}" if str(inner) else type(inner).__name__


def timed(name: str, run: Callable[[], tuple[bool, str]], *, secrets: Sequence[str] = ()) -> Check:
    """Run one check; an exception is its failure, never a traceback."""
    start = time.monotonic()
    try:
        ok, detail = run()
    except Exception as exc:
        ok, detail = False, describe_error(exc)
    return Check(name, ok, one_line(detail, secrets), time.monotonic() - start)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _age(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


# -- 1. broker ---------------------------------------------------------------------------------


def broker(app: Any, url: str, timeout_s: float) -> Check:
    """The broker answers a ping within ``timeout_s`` (a black-holed one fails in it)."""
    return timed("broker", lambda: brokers.of(app).ping(url, timeout_s), secrets=passwords(url))


# -- 2. database -------------------------------------------------------------------------------


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (``None``: not SQLite, or in memory)."""
    if not url.startswith("sqlite"):
        return None
    from sqlalchemy.engine import make_url

    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def database(url: str) -> Check:
    """``SELECT 1`` through the platform's engine; a missing SQLite file is not created."""

    def select_one() -> tuple[bool, str]:
        path = sqlite_path(url)
        if path is not None and not path.exists():
            # SQLite would create an empty database; workers create (and migrate) it at start.
            return False, (
                f"{masked(url)}: no database file at {path} "
                "(workers create it at start; `celery -A APP db upgrade` does it by hand)"
            )
        import sqlalchemy as sa

        from jobs_platform.db import engine_for

        start = time.monotonic()
        try:
            with engine_for(url).connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        except sa.exc.SQLAlchemyError as exc:
            return False, f"{masked(url)} does not answer: {describe_error(exc)}"
        return True, f"{masked(url)} answered SELECT 1 in {_ms(time.monotonic() - start)}"

    return timed("database", select_one, secrets=passwords(url))


# -- 3. consumers ------------------------------------------------------------------------------


def consumers_by_queue(replies: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Queue -> the workers consuming it, from an ``active_queues`` broadcast's replies."""
    by_queue: dict[str, list[str]] = {}
    for worker, queues in sorted((replies or {}).items()):
        for queue in queues if isinstance(queues, list) else ():
            name = queue.get("name") if isinstance(queue, dict) else None
            if isinstance(name, str):
                by_queue.setdefault(name, []).append(worker)
    return by_queue


def consumers(
    queues: Sequence[str], replies: Mapping[str, Any] | None, *, wait_s: float, elapsed_s: float
) -> list[Check]:
    """One check per queue: at least one worker answered that it consumes it."""
    by_queue = consumers_by_queue(replies)
    answered = len(replies or {})
    out = []
    for queue in queues:
        workers = by_queue.get(queue, [])
        if workers:
            detail = f"consumed by {', '.join(workers)}"
        elif answered:
            detail = (
                f"no worker consumes {queue} "
                f"({answered} worker(s) answered within {wait_s:g} s, none for {queue})"
            )
        else:
            detail = f"no worker consumes {queue} (no worker answered within {wait_s:g} s)"
        out.append(Check(f"consumers:{queue}", bool(workers), detail, elapsed_s))
    return out


# -- 5. beat -----------------------------------------------------------------------------------


def schedule_gap_s(beat_schedule: Mapping[str, Any], max_loop_interval_s: float) -> float | None:
    """Longest expected time between two beat ticks (``None``: no schedule, nothing to check).

    Beat wakes when the next entry is due and at least every ``beat_max_loop_interval``:
    an interval entry shorter than that sets the pace; a crontab's is left to the loop.
    """
    if not beat_schedule:
        return None
    from celery.schedules import maybe_schedule

    gap = max_loop_interval_s
    for entry in beat_schedule.values():
        every = getattr(maybe_schedule(_entry_schedule(entry)), "run_every", None)
        if isinstance(every, dt.timedelta):
            gap = min(gap, every.total_seconds())
    return gap


def _entry_schedule(entry: Any) -> Any:
    return entry.get("schedule") if isinstance(entry, Mapping) else getattr(entry, "schedule", None)


def beat_verdict(
    gap_s: float | None, ticks: Mapping[str, str], now: dt.datetime
) -> tuple[bool, str]:
    """Ticking if the newest tick is within twice the expected gap plus slack."""
    if gap_s is None:
        return True, "no beat schedule in this app: nothing to check"
    bound = 2 * gap_s + BEAT_SLACK_S
    times = {entry: parse_time(value) for entry, value in ticks.items()}
    readable = {entry: moment for entry, moment in times.items() if moment is not None}
    if not readable:
        what = "no readable tick" if ticks else "no tick at all"
        return False, f"beat has never ticked ({what}): is a beat running?"
    entry, newest = max(readable.items(), key=lambda item: item[1])
    age = (now - newest).total_seconds()
    if age > bound:
        return False, (
            f"beat is silent: newest tick {_age(age)} ago ({entry}), bound {_age(bound)} "
            f"(2 x {gap_s:g} s + {BEAT_SLACK_S:g} s)"
        )
    return True, f"newest tick {_age(max(age, 0.0))} ago ({entry}), bound {_age(bound)}"


def beat(
    client: redis.Redis,
    key: str,
    beat_schedule: Mapping[str, Any],
    max_loop_interval_s: float,
    now: Callable[[], dt.datetime],
) -> Check:
    def run() -> tuple[bool, str]:
        gap = schedule_gap_s(beat_schedule, max_loop_interval_s)
        if gap is None:
            return beat_verdict(None, {}, now())
        ticks = {lease.text(k): lease.text(v) for k, v in client.hgetall(key).items()}
        return beat_verdict(gap, ticks, now())

    return timed("beat", run)


# -- 6. dead-letter spool ----------------------------------------------------------------------


def spool_bound_s(drain_interval_s: float) -> float:
    return 2 * drain_interval_s + SPOOL_SLACK_S


def spool_verdict(
    depth: int,
    oldest: str | None,
    now: dt.datetime,
    bound_s: float,
    aside: SetAside | None = None,
) -> tuple[bool, str]:
    """Draining if empty, or if its oldest dead letter has waited less than ``bound_s``; and
    nothing set aside (``aside``: refused by the database for good, or unreadable).

    Every dead letter passes through the spool for a moment (spooled before the database
    write), so depth alone would fail on a healthy burst; one the drainers have left there
    for longer than two drain passes means the database writes are failing. A dead letter
    set aside waits for a person: it fails the check until it is dealt with.
    """
    if aside is not None and (aside.rejected or aside.unreadable):
        return False, aside.describe()
    if depth == 0:
        return True, "empty"
    failed_at = None
    if oldest is not None:
        try:
            failed_at = parse_time(json.loads(oldest).get("failed_at"))
        except (ValueError, AttributeError):
            failed_at = None
    if failed_at is None:
        return False, (
            f"{depth} entr{'y' if depth == 1 else 'ies'} in the spool and the oldest is not a "
            "dead letter the drainer can read (a drainer would have moved it aside)"
        )
    age = (now - failed_at).total_seconds()
    if age > bound_s:
        return False, (
            f"not draining: {depth} dead letter(s) in the spool, the oldest waiting "
            f"{_age(age)} (bound {_age(bound_s)}): database writes fail or no worker drains "
            "(`celery -A APP dlq drain`)"
        )
    return True, f"{depth} dead letter(s) in the spool, the oldest {_age(max(age, 0.0))}"


@dataclasses.dataclass(frozen=True)
class SetAside:
    """The spool's side lists (:mod:`jobs_platform.deadletter.spool`)."""

    key: str
    rejected: int = 0
    unreadable: int = 0
    #: Why the database refused the latest one (the letter and its error).
    why: str | None = None

    def describe(self) -> str:
        """Where they are, what to do (first: a long cause may be cut), then the cause."""
        parts = []
        if self.rejected:
            parts.append(
                f"{self.rejected} dead letter(s) the database refused for good, in "
                f"{spool_keys.rejected_key(self.key)}"
            )
        if self.unreadable:
            parts.append(
                f"{self.unreadable} unreadable entr{'y' if self.unreadable == 1 else 'ies'} in "
                f"{spool_keys.unreadable_key(self.key)}"
            )
        text = "; ".join(parts) + " (ops/runbooks/dead-letter-set-aside.md)"
        if self.rejected and self.why:
            text += f"; the latest: {self.why}"
        return text


def spool(
    client: redis.Redis, key: str, drain_interval_s: float, now: Callable[[], dt.datetime]
) -> Check:
    def run() -> tuple[bool, str]:
        pipe = client.pipeline(transaction=False)
        pipe.llen(key)
        pipe.lindex(key, 0)  # the spool is RPUSHed: the head is the oldest
        pipe.llen(spool_keys.rejected_key(key))
        pipe.llen(spool_keys.unreadable_key(key))
        pipe.get(spool_keys.rejected_why_key(key))
        depth, oldest, rejected, unreadable, why = pipe.execute()
        head = None if oldest is None else lease.text(oldest)
        aside = SetAside(
            key, int(rejected), int(unreadable), None if why is None else lease.text(why)
        )
        return spool_verdict(int(depth), head, now(), spool_bound_s(drain_interval_s), aside)

    return timed("spool", run)


# -- 7. oldest waiting job ---------------------------------------------------------------------


def objectives(settings: Any) -> dict[str, float]:
    """Each queue's objective (JOBS_QUEUE_OBJECTIVES; the settings check they cover every queue)."""
    return {str(q): float(s) for q, s in settings.queue_objectives.items()}


def backlog_verdict(state: QueueState, now: dt.datetime, objective_s: float) -> tuple[bool, str]:
    """Within its objective if the oldest waiting job is younger than ``objective_s``."""
    depth = state.length
    if depth == 0:
        return True, f"empty (objective {_age(objective_s)})"
    if state.oldest_enqueued_at is None:
        return True, (
            f"{depth} waiting; the oldest carry no {history.ENQUEUED_HEADER} stamp "
            "(not sent by ReliableTask): age unknown"
        )
    age = max(0.0, now.timestamp() - state.oldest_enqueued_at)
    if age > objective_s:
        return False, (
            f"oldest waiting job {_age(age)} old, objective {_age(objective_s)} ({depth} waiting)"
        )
    return True, f"{depth} waiting, oldest {_age(age)} (objective {_age(objective_s)})"


def backlog(
    app: Any, queues: Sequence[str], goals: Mapping[str, float], now: Callable[[], dt.datetime]
) -> list[Check]:
    """One check per queue, from the broker's reading of its queues (the reader the
    exporter uses: every priority sub-list on Redis)."""
    start = time.monotonic()
    try:
        states = brokers.of(app).queue_states(app, queues)
    except Exception as exc:
        detail = one_line(describe_error(exc), passwords(app.conf.broker_url or ""))
        return [Check(f"backlog:{q}", False, detail, time.monotonic() - start) for q in queues]
    moment = now()
    out = []
    for queue in queues:
        ok, detail = backlog_verdict(states[queue], moment, goals[queue])
        out.append(Check(f"backlog:{queue}", ok, detail, time.monotonic() - start))
    return out


# -- 8. circuit breakers -----------------------------------------------------------------------


def breakers_verdict(readings: Sequence[Reading]) -> tuple[bool, str]:
    """``(warn, detail)``: a breaker open or half-open is a warning, not a failure. The
    platform is doing its job (the downstream is down, its jobs wait without burning
    attempts); failing health would restart workers that are fine."""
    if not readings:
        return False, "no circuit breaker declared"
    tripped = [r for r in readings if r.state != "closed"]
    if not tripped:
        return False, f"{len(readings)} breaker(s), all closed"
    parts = []
    for reading in tripped:
        if reading.state == "open":
            probe = reading.next_probe_in_s or 0.0
            parts.append(f"{reading.key} open (next probe in {_age(probe)})")
        else:
            parts.append(f"{reading.key} half-open (probe {reading.probe or 'not started'})")
    return True, (
        f"{len(tripped)} of {len(readings)} breaker(s) not closed: {'; '.join(parts)}: their "
        "jobs wait (ops/runbooks/breaker-open.md)"
    )


def breakers(client: redis.Redis, declared: Sequence[str]) -> Check:
    """Every breaker the app declares or a job asked for lately (``flow list``'s reading)."""
    start = time.monotonic()
    try:
        warn, detail = breakers_verdict(flow_state.breakers(client, list(declared)))
    except Exception as exc:
        return Check("breakers", False, one_line(describe_error(exc)), time.monotonic() - start)
    return Check("breakers", True, one_line(detail), time.monotonic() - start, warn=warn)
