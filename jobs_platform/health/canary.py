"""The canary: a tiny job per queue that must come back within a bound.

A worker can be alive (it answers control pings) yet consume nothing, a known Celery
failure after a broker reconnect, and a stopped pool looks the same. Only a job that is
really fetched and run tells: ``health`` sends ``jobs.health.canary`` to each queue and
waits for it to set ``jobs:health:canary:done:<id>`` (:mod:`.keys`) on the coordination
Redis.

Why this shape:

* The task reports through its own short-lived key, not the result backend: no result is
  stored for a day per run, and it works whatever the backend is.
* It runs on whichever queue it is sent to (``apply_async(queue=Q)`` wins over its route);
  ``max_retries=0``, a short time limit, and it never raises (a canary that cannot report
  is a late canary, not a dead letter).
* It carries its own deadline instead of Celery's ``expires``: an expired message is
  *revoked*, and the platform records every revoked-expired job as a dead letter. A late
  canary does nothing when it finally runs.
* One canary in flight per queue (:func:`keys.canary_inflight_key`, with the canary's
  lifetime as TTL): a run that finds one younger than its bound waits on it, one older is
  late at once, and a queue nobody consumes collects at most one canary per lifetime.
* It goes out at the broker's highest priority (``Broker.highest_priority``; on Redis 0,
  kombu's base list, which is also the default), so a canary does wait behind a backlog.
  A late canary is therefore judged with the workers' own numbers (:func:`late_verdict`):
  every consumer busy (all slots running, or jobs finishing) is a busy queue, not a
  stuck one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import redis

from jobs_platform import brokers, coordination
from jobs_platform.health.keys import canary_done_key, canary_inflight_key
from jobs_platform.process_local import redis_client

logger = logging.getLogger("jobs_platform.health")

CANARY_TASK = "jobs.health.canary"
#: A canary older than this never reports (its message may still wait in a queue nobody
#: consumes; when it is finally fetched it does nothing).
CANARY_LIFETIME_S = 60.0
CANARY_TIME_LIMIT_S = 10.0


def install(app: Any) -> Any:
    """Register ``jobs.health.canary`` on ``app`` (idempotent); returns the task."""
    existing = app._tasks.get(CANARY_TASK)  # not app.tasks: that would finalize the app
    if existing is not None:
        return existing
    from jobs_platform.task import ReliableTask

    settings = app.jobs_settings
    # Fits any app's visibility timeout, as the maintenance tasks do (a test app's may be 8 s).
    hard = min(CANARY_TIME_LIMIT_S, (settings.visibility_timeout - settings.visibility_margin) / 2)

    @app.task(  # type: ignore[untyped-decorator]
        base=ReliableTask,
        bind=True,
        name=CANARY_TASK,
        queue="fast",
        max_retries=0,
        time_limit=hard,
        soft_time_limit=hard * 0.8,
        ignore_result=True,
    )
    def canary(self: Any, canary_id: str, deadline: float) -> bool:
        return report(coordination.url_of(self.app.jobs_settings), canary_id, deadline)

    return canary


def report(url: str, canary_id: str, deadline: float) -> bool:
    """The canary's body: mark ``canary_id`` done unless its deadline (Unix time) passed."""
    if time.time() > deadline:
        return False  # late: whoever waited for it has given its verdict already
    try:
        redis_client(url).set(canary_done_key(canary_id), "1", ex=int(CANARY_LIFETIME_S))
    except redis.RedisError as exc:
        logger.warning(
            "jobs.health.canary_unreported: canary %s ran but could not report: %s",
            canary_id,
            exc,
            extra={"event": "jobs.health.canary_unreported"},
        )
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Inflight:
    """A canary on ``queue``: sent at ``sent_at`` (Unix time), by this run or an earlier one."""

    queue: str
    id: str
    sent_at: float
    sent_now: bool

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "sent_at": self.sent_at})


def _read_inflight(queue: str, raw: Any) -> Inflight | None:
    try:
        data = json.loads(raw)
        return Inflight(queue, str(data["id"]), float(data["sent_at"]), sent_now=False)
    except (TypeError, ValueError, KeyError):
        return None


def send_or_join(app: Any, client: redis.Redis, queue: str, *, now: float) -> Inflight:
    """The canary to wait for on ``queue``: the one in flight if not done yet, else a new one."""
    current = _read_inflight(queue, client.get(canary_inflight_key(queue)))
    if current is not None and not client.exists(canary_done_key(current.id)):
        return current
    fresh = Inflight(queue, uuid.uuid4().hex, now, sent_now=True)
    app.tasks[CANARY_TASK].apply_async(
        (fresh.id, now + CANARY_LIFETIME_S),
        queue=queue,
        priority=brokers.of(app).highest_priority,
    )
    # Recorded once sent: a canary that never left must not keep later runs waiting on it.
    client.set(canary_inflight_key(queue), fresh.to_json(), ex=int(CANARY_LIFETIME_S))
    return fresh


def wait(
    client: redis.Redis, canaries: Sequence[Inflight], *, bound_s: float
) -> dict[str, float | None]:
    """Queue -> round-trip seconds of its canary, or ``None`` if not back within ``bound_s``.

    Polls every done key in one MGET, quickly at first (a healthy round trip takes
    milliseconds), until each canary's own deadline (``sent_at + bound_s``).
    """
    pending = {c.queue: c for c in canaries}
    back: dict[str, float | None] = {}
    pause = 0.005
    while pending:
        now = time.time()
        for queue, c in list(pending.items()):
            if now > c.sent_at + bound_s:
                back[queue] = None
                del pending[queue]
        if not pending:
            break
        order = list(pending.values())
        done = client.mget([canary_done_key(c.id) for c in order])
        now = time.time()
        for c, flag in zip(order, done, strict=True):
            if flag is not None:
                back[c.queue] = max(0.0, now - c.sent_at)
                del pending[c.queue]
        time.sleep(pause)
        pause = min(pause * 1.5, 0.1)
    return back


# -- a late canary: busy or stuck? -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Progress:
    """What one consumer did while the canary waited (from two ``stats`` and one ``active``)."""

    worker: str
    answered: bool
    running: int = 0
    slots: int | None = None
    finished: int | None = None  # jobs started meanwhile (canaries not counted)

    @property
    def busy(self) -> bool:
        full = self.slots is not None and self.running >= self.slots
        return self.answered and (full or bool(self.finished))

    def describe(self) -> str:
        if not self.answered:
            return f"{self.worker} did not answer"
        slots = "?" if self.slots is None else str(self.slots)
        finished = "?" if self.finished is None else str(self.finished)
        return f"{self.worker}: {self.running}/{slots} running, {finished} started meanwhile"


def _total(stats: Any) -> int | None:
    totals = stats.get("total") if isinstance(stats, dict) else None
    if not isinstance(totals, dict):
        return None
    return sum(int(n) for name, n in totals.items() if name != CANARY_TASK)


def _slots(stats: Any) -> int | None:
    pool = stats.get("pool") if isinstance(stats, dict) else None
    value = pool.get("max-concurrency") if isinstance(pool, dict) else None
    return value if isinstance(value, int) else None


def progress(
    worker: str,
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    active: Mapping[str, Any],
) -> Progress:
    if worker not in after or worker not in active:
        return Progress(worker, answered=False)
    running = [job for job in active[worker] or () if not _is_canary(job)]
    first, last = _total(before.get(worker)), _total(after[worker])
    finished = None if first is None or last is None else max(0, last - first)
    return Progress(worker, True, len(running), _slots(after[worker]), finished)


def _is_canary(job: Any) -> bool:
    return isinstance(job, dict) and job.get("name") == CANARY_TASK


def late_verdict(queue: str, bound_s: float, progresses: Sequence[Progress]) -> tuple[bool, str]:
    """A canary not back in ``bound_s``: busy (ok) if every consumer is busy, else stuck."""
    if not progresses:
        return False, f"no canary back within {bound_s:g} s and no worker consumes {queue}"
    seen = "; ".join(p.describe() for p in progresses)
    if all(p.busy for p in progresses):
        return True, f"busy: canary waits behind running jobs ({seen})"
    return False, f"no canary back within {bound_s:g} s: alive but not consuming? ({seen})"
