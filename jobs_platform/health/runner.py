"""Run the selected checks at once, each in its own thread, and stop at the deadline.

The broker is pinged first (bounded by a short socket timeout): when it does not answer,
every check that needs it fails at once as "not checked" instead of each waiting for its
own timeout. The database check runs alongside. The rest run in parallel, so a healthy
run takes about one control-reply wait (the ``active_queues`` broadcast waits its whole
timeout for workers it cannot count in advance); a check still running at the deadline
fails as "no answer", and its daemon thread is abandoned with the process.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import redis

from jobs_platform import coordination, redis_urls
from jobs_platform.clock import utcnow
from jobs_platform.flow.state import declared_breakers
from jobs_platform.health import canary, checks
from jobs_platform.health.checks import Check
from jobs_platform.health.keys import beat_ticks_key

T = TypeVar("T")

#: The checks, in the order they are reported.
CHECKS = ("broker", "database", "consumers", "canary", "beat", "spool", "backlog", "breakers")
#: Checks made once per selected queue (``--queue`` restricts them).
PER_QUEUE = frozenset({"consumers", "canary", "backlog"})
#: Checks that need the broker.
ON_BROKER = frozenset({"consumers", "canary", "beat", "spool", "backlog", "breakers"})
#: Kept for printing the report after the deadline.
MARGIN_S = 0.3


@dataclasses.dataclass(frozen=True)
class Budget:
    """How ``--timeout`` is shared out: ping, then control replies and the canary at once,
    then (only for a late canary) one more control round to tell busy from stuck."""

    total_s: float

    @property
    def ping_s(self) -> float:
        return min(1.0, 0.2 * self.total_s)

    @property
    def reply_s(self) -> float:
        return min(1.0, 0.2 * self.total_s)

    @property
    def canary_s(self) -> float:
        return max(0.1, self.total_s - self.ping_s - self.reply_s - MARGIN_S)


def names(selected: Sequence[str], queues: Sequence[str]) -> list[str]:
    """The check lines a run reports, in order."""
    out = []
    for check in CHECKS:
        if check in selected:
            out.extend([f"{check}:{q}" for q in queues] if check in PER_QUEUE else [check])
    return out


class Background(Generic[T]):
    """``fn()`` in a daemon thread (a stuck driver call must never keep the process alive)."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn = fn
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc

    def done(self, timeout_s: float) -> bool:
        self._thread.join(max(0.0, timeout_s))
        return not self._thread.is_alive()

    def result(self) -> T:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


def run(
    app: Any, *, queues: Sequence[str], selected: Sequence[str], timeout_s: float
) -> list[Check]:
    """Every selected check (one per queue where it applies), in :data:`CHECKS` order."""
    start = time.monotonic()
    budget = Budget(timeout_s)
    settings = app.jobs_settings
    jobs: list[tuple[list[str], Background[list[Check]]]] = []
    if "database" in selected:
        url = settings.database_url
        jobs.append((["database"], Background(lambda: [checks.database(url)])))
    results, on_broker = _ping_first(app, settings.broker_url, selected, queues, budget)
    if on_broker:
        client = redis_urls.client(
            coordination.url_of(settings),
            socket_timeout=budget.ping_s,
            socket_connect_timeout=budget.ping_s,
        )
        jobs.extend(_broker_jobs(app, client, on_broker, queues, budget))
    deadline = start + timeout_s - MARGIN_S
    for expected, job in jobs:
        for check in _collect(expected, job, deadline, timeout_s, start):
            results.setdefault(check.name, check)
    return [results[name] for name in names(selected, queues) if name in results]


def _ping_first(
    app: Any, url: str, selected: Sequence[str], queues: Sequence[str], budget: Budget
) -> tuple[dict[str, Check], list[str]]:
    """The broker's line (if selected) and the broker checks still worth running."""
    results: dict[str, Check] = {}
    on_broker = [c for c in selected if c in ON_BROKER]
    if "broker" not in selected and not on_broker:
        return results, []
    ping = checks.broker(app, url, budget.ping_s)
    if "broker" in selected:
        results["broker"] = ping
    if not ping.ok:
        why = "not checked: the broker does not answer"
        if "broker" not in selected:  # else its own line says why
            why = f"{why} ({ping.detail})"
        for name in names(on_broker, queues):
            results[name] = Check(name, False, why)
        return results, []
    return results, on_broker


def _collect(
    expected: Sequence[str],
    job: Background[list[Check]],
    deadline: float,
    timeout_s: float,
    start: float,
) -> list[Check]:
    """The job's checks, or each of ``expected`` failed (no answer in time, or a bug)."""
    if job.done(deadline - time.monotonic()):
        try:
            got = job.result()
        except Exception as exc:  # a bug in a check: still one line each, no traceback
            failed = checks.describe_error(exc)
        else:
            seen = {check.name for check in got}
            return got + [Check(n, False, "no result") for n in expected if n not in seen]
    else:
        failed = f"no answer within the {timeout_s:g} s timeout"
    return [Check(name, False, failed, time.monotonic() - start) for name in expected]


def _broker_jobs(
    app: Any, client: redis.Redis, selected: Sequence[str], queues: Sequence[str], budget: Budget
) -> list[tuple[list[str], Background[list[Check]]]]:
    settings = app.jobs_settings
    jobs = []
    fleet = [c for c in ("consumers", "canary") if c in selected]
    if fleet:
        jobs.append(
            (names(fleet, queues), Background(lambda: _fleet(app, client, queues, fleet, budget)))
        )
    if "beat" in selected:
        schedule = dict(app.conf.beat_schedule or {})
        loop = float(app.conf.beat_max_loop_interval or _default_max_loop())
        jobs.append(
            (
                ["beat"],
                Background(lambda: [checks.beat(client, beat_ticks_key(), schedule, loop, utcnow)]),
            )
        )
    if "spool" in selected:
        key, interval = settings.dlq_spool_key, settings.dlq_drain_interval
        jobs.append((["spool"], Background(lambda: [checks.spool(client, key, interval, utcnow)])))
    if "breakers" in selected:
        declared = declared_breakers(app)
        jobs.append((["breakers"], Background(lambda: [checks.breakers(client, declared)])))
    if "backlog" in selected:
        goals = checks.objectives(settings)
        jobs.append(
            (
                names(["backlog"], queues),
                Background(lambda: checks.backlog(app, queues, goals, utcnow)),
            )
        )
    return jobs


def _default_max_loop() -> float:
    from celery.beat import DEFAULT_MAX_INTERVAL

    return float(DEFAULT_MAX_INTERVAL)


def _inspect(
    app: Any, command: str, timeout_s: float, destination: Sequence[str] | None = None
) -> dict[str, Any]:
    """One control broadcast; with ``destination`` it returns as soon as all have answered."""
    limit = len(destination) if destination else None
    inspector = app.control.inspect(
        timeout=timeout_s, destination=list(destination) if destination else None, limit=limit
    )
    return dict(getattr(inspector, command)() or {})


def _fleet(
    app: Any,
    client: redis.Redis,
    queues: Sequence[str],
    selected: Sequence[str],
    budget: Budget,
) -> list[Check]:
    """Consumers and canaries: they share the broadcasts."""
    start = time.monotonic()
    out: dict[str, Check] = {}
    sent: list[canary.Inflight] = []
    if "canary" in selected:
        if canary.CANARY_TASK not in app.tasks:
            for q in queues:
                out[f"canary:{q}"] = Check(
                    f"canary:{q}",
                    False,
                    f"the app does not register {canary.CANARY_TASK}: "
                    "call jobs_platform.health.install(app)",
                )
        else:
            for q in queues:
                try:
                    sent.append(canary.send_or_join(app, client, q, now=time.time()))
                except Exception as exc:
                    out[f"canary:{q}"] = Check(
                        f"canary:{q}", False, f"not sent: {checks.describe_error(exc)}"
                    )
    replies = Background(lambda: _inspect(app, "active_queues", budget.reply_s))
    before = Background(lambda: _inspect(app, "stats", budget.reply_s)) if sent else None
    back = canary.wait(client, sent, bound_s=budget.canary_s) if sent else {}
    by_queue = checks.consumers_by_queue(replies.result())
    if "consumers" in selected:
        for check in checks.consumers(
            queues, replies.result(), wait_s=budget.reply_s, elapsed_s=time.monotonic() - start
        ):
            out[check.name] = check
    late = [q for q, took in back.items() if took is None]
    progresses = _progress(app, late, by_queue, before, budget) if late else {}
    for c in sent:
        took = back[c.queue]
        name = f"canary:{c.queue}"
        if took is not None:
            who = "" if c.sent_now else " (sent by an earlier run)"
            out[name] = Check(name, True, f"round trip {took * 1000:.0f} ms{who}", took)
            continue
        workers = by_queue.get(c.queue, [])
        ok, detail = canary.late_verdict(
            c.queue, budget.canary_s, [progresses[w] for w in workers if w in progresses]
        )
        out[name] = Check(name, ok, checks.one_line(detail), time.monotonic() - start)
    return list(out.values())


def _progress(
    app: Any,
    late: Sequence[str],
    by_queue: Mapping[str, Sequence[str]],
    before: Background[dict[str, Any]] | None,
    budget: Budget,
) -> dict[str, canary.Progress]:
    """What each consumer of a late queue did meanwhile (one more stats and active round)."""
    workers = sorted({w for q in late for w in by_queue.get(q, [])})
    if not workers:
        return {}
    first = before.result() if before is not None else {}
    after = Background(lambda: _inspect(app, "stats", budget.reply_s, workers))
    active = _inspect(app, "active", budget.reply_s, workers)
    last = after.result()
    return {w: canary.progress(w, first, last, active) for w in workers}
