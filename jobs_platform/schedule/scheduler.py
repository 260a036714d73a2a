"""The platform's beat scheduler: Celery's ``beat_schedule``, sent once per slot by one leader.

``celery -A APP beat`` runs it (``beat_scheduler`` is set by :func:`~jobs_platform.schedule.
celery_config`). Any number of beats may run; on each tick a beat:

1. holds the leader lock (:mod:`.leader`) or stands by;
2. as leader, for each entry, lists the slots due since the newest one decided
   (``jobs:beat:done``, shared by all beats), and lets the entry's catch-up policy
   (:mod:`.policies`) choose which to send;
3. sends a slot only after recording it with ``SET jobs:beat:slot:<entry>:<slot> NX``
   (:mod:`.slots`): whoever records a slot first sends it, nobody else does. An entry with
   ``overlap="skip"`` also needs its overlap marker (:mod:`.running`) free;
4. publishes the run as an ordinary job of the entry's task (a ReliableTask keeps its
   queue, retries and dead letters), with the entry and slot in its headers.

State lives on the broker's Redis, none in a local file: a beat on another machine
resumes exactly where the last one stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import uuid
from collections.abc import Callable
from functools import cached_property
from typing import Any

import redis
from celery import beat

from jobs_platform import coordination, redis_urls, rules
from jobs_platform.clock import utcnow
from jobs_platform.errors import ConfigError
from jobs_platform.metrics import counters
from jobs_platform.process_local import REDIS_TIMEOUT_S
from jobs_platform.schedule import metrics, running
from jobs_platform.schedule.leader import LeaderLock
from jobs_platform.schedule.policies import SKIP, EntryPolicy, plan, split_options
from jobs_platform.schedule.slots import (
    ENTRY_HEADER,
    SLOT_HEADER,
    SlotRecords,
    due_slots,
    interval_of,
    next_slot,
    slot_iso,
    slot_ttl_s,
)
from jobs_platform.schedule.state import BeatState
from jobs_platform.urls import masked

logger = logging.getLogger("jobs_platform.schedule")

#: Shortest sleep between ticks (a tick never returns 0: Celery would spin).
MIN_SLEEP_S = 0.01
#: Sleep after a failed publish before the slot is tried again.
RETRY_SOON_S = 1.0
#: ``options`` an entry may not set: every run gets its own task id.
REFUSED_OPTIONS = ("task_id",)


def _static_arguments(entry: Any) -> tuple[list[Any], dict[str, Any]]:
    """An entry's arguments without the lazy ones (``BeatLazyFunc``: evaluated, and so
    checked, when each run is sent)."""

    def known(value: Any) -> Any:
        return None if isinstance(value, beat.BeatLazyFunc) else value

    return [known(a) for a in entry.args or ()], {
        k: known(v) for k, v in (entry.kwargs or {}).items()
    }


def default_sender_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Scheduler(beat.Scheduler):  # type: ignore[misc]
    """A Celery beat scheduler that sends each slot of each entry once (see the module doc)."""

    max_interval: float

    def __init__(
        self,
        app: Any,
        *args: Any,
        clock: Callable[[], dt.datetime] | None = None,
        sender_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.clock = clock or utcnow
        self.sender_id = sender_id or default_sender_id()
        self.leading = False
        self._closed = False
        self._role: str | None = None  # "leader" / "standby", as last logged
        self._policies: dict[str, EntryPolicy] = {}
        self._options: dict[str, dict[str, Any]] = {}
        self.lock_timeout_s = float(app.jobs_settings.beat_lock_timeout)
        super().__init__(app, *args, **kwargs)
        # The lock must be extended well within its timeout, whatever -M/--max-interval says.
        self.max_interval = min(float(self.max_interval), self.lock_timeout_s / 3)

    # -- set-up ----------------------------------------------------------------------------

    def setup_schedule(self) -> None:
        super().setup_schedule()
        # Bad policies or schedules stop beat at start, naming the entry.
        for name, entry in self.schedule.items():
            self._policy(name, entry)

    def _policy(self, name: str, entry: Any) -> EntryPolicy:
        if name not in self._policies:
            policy, options = split_options(name, entry.options)
            refused = sorted(set(options) & set(REFUSED_OPTIONS))
            if refused:
                raise ConfigError(
                    f"beat entry {name!r}: options {refused} cannot be set; every run gets "
                    "its own task id"
                )
            interval_of(entry.schedule)  # a zero or negative interval is refused
            rules.check_beat_entry_arguments(name, *_static_arguments(entry))
            self._policies[name], self._options[name] = policy, options
        return self._policies[name]

    @cached_property
    def redis(self) -> redis.Redis:
        url = coordination.url_of(self.app.jobs_settings)
        if not url.startswith(("redis://", "rediss://", "unix://", "sentinel://")):
            raise ConfigError(
                "the platform's beat keeps its leader lock and slot records on the "
                f"coordination Redis; {masked(url)!r} is not a Redis URL "
                "(set JOBS_COORDINATION_URL)"
            )
        return redis_urls.client(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )

    @cached_property
    def leader(self) -> LeaderLock:
        return LeaderLock(
            self.redis, self.app.main or "celery", self.sender_id, self.lock_timeout_s
        )

    @cached_property
    def records(self) -> SlotRecords:
        return SlotRecords(self.redis)

    @cached_property
    def markers(self) -> running.RunningMarkers:
        return running.RunningMarkers(self.redis)

    @cached_property
    def state(self) -> BeatState:
        return BeatState(self.redis)

    @property
    def info(self) -> str:
        return (
            f"    . leader lock -> {self.leader.key} ({self.lock_timeout_s:g} s)\n"
            f"    . slot records -> {masked(coordination.url_of(self.app.jobs_settings))}"
        )

    # -- ticking ---------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """One pass: hold or seek the lead; as leader, send what is due. Returns the sleep."""
        if self._closed:
            # A SIGTERM that landed inside a publish can be swallowed as an I/O error by the
            # send's handler; beat then keeps ticking. Once closed it must never lead again.
            raise SystemExit(0)
        try:
            return self._tick()
        except redis.RedisError as exc:
            # Without Redis the lock cannot be extended: stop acting as leader at once.
            self._set_leading(False, reason=f"Redis error: {exc}")
            return float(self.max_interval)

    def _tick(self) -> float:
        leading = self.leader.hold()
        self._set_leading(leading)
        if not leading:
            return float(self.max_interval)
        now = self.clock()
        names = list(self.schedule)
        done = self.state.done_up_to(names)
        self.state.record_ticks(names, now)
        wake = float(self.max_interval)
        for name in names:
            try:
                wake = min(wake, self._tick_entry(name, self.schedule[name], done[name], now))
            except redis.RedisError:
                raise
            except Exception:
                # One entry whose slots cannot be computed must not stop the others.
                logger.exception(
                    "beat entry %r: cannot decide its slots; trying again next tick",
                    name,
                    extra={"event": "jobs.beat.entry_failed", "entry": name},
                )
        return max(MIN_SLEEP_S, wake)

    def _tick_entry(
        self, name: str, entry: Any, done: dt.datetime | None, now: dt.datetime
    ) -> float:
        """Send the due slots of one entry; returns the seconds until its next slot."""
        policy = self._policy(name, entry)
        sched = entry.schedule
        if done is None:
            # A new entry starts from now, as in Celery: its first run is its next slot.
            self.state.advance(name, now)
            logger.info(
                "beat entry %r is new: first slot %s",
                name,
                slot_iso(next_slot(sched, now)),
                extra={"event": "jobs.beat.new_entry", "entry": name},
            )
            return self._until(next_slot(sched, now))
        due = due_slots(sched, done, now, keep=policy.catch_up + 1)
        if due.count:
            decided = plan(due.newest, due.count, now, policy)
            if decided.missed:
                self._skipped(
                    name,
                    "missed",
                    decided.missed,
                    "%s%d slot(s) between %s and %s missed while no beat ran; catch_up=%d",
                    "" if due.exact else "at least ",
                    decided.missed,
                    slot_iso(done),
                    slot_iso(due.newest[-1]),
                    policy.catch_up,
                )
            for slot in decided.send:
                if not self._send(name, entry, policy, slot):
                    return RETRY_SOON_S  # the slot stays due and is tried again
            self.state.advance(name, due.newest[-1])
        return self._until(next_slot(sched, now))

    def _until(self, moment: dt.datetime) -> float:
        return (moment - self.clock()).total_seconds()

    # -- sending ---------------------------------------------------------------------------

    def _send(self, name: str, entry: Any, policy: EntryPolicy, slot: dt.datetime) -> bool:
        """Record and send one slot; False if the publish failed (the record is undone)."""
        if not self.records.claim(name, slot, self.sender_id, slot_ttl_s(entry.schedule, slot)):
            self._skipped(
                name,
                "taken",
                1,
                "slot %s was already sent by %s",
                slot_iso(slot),
                self.records.holder(name, slot),
            )
            return True
        task_id = str(uuid.uuid4())
        if policy.overlap == SKIP:
            holder = self.markers.acquire(name, task_id, self._run_budget_s(entry))
            if holder != task_id:
                self.records.mark_skipped(name, slot, self.sender_id, "overlap")
                self._skipped(
                    name,
                    "overlap",
                    1,
                    "slot %s skipped: its previous run %s is still queued or running",
                    slot_iso(slot),
                    holder,
                )
                return True
        try:
            result = self._publish(name, entry, slot, task_id)
        except Exception:
            logger.exception(
                "beat entry %r: could not send slot %s; it stays due",
                name,
                slot_iso(slot),
                extra={"event": "jobs.beat.send_failed", "entry": name},
            )
            self._undo(name, slot, task_id)
            return False
        sent_id = getattr(result, "id", task_id)
        if sent_id != task_id:
            # unique_for answered with a job already queued: that one is not ours to mark.
            self.markers.release(name, task_id)
        metrics.SENT.labels(name).inc()
        logger.info(
            "beat entry %r: sent slot %s as %s[%s]",
            name,
            slot_iso(slot),
            entry.task,
            sent_id,
            extra={"event": "jobs.beat.sent", "entry": name, "task_name": entry.task},
        )
        return True

    def _publish(self, name: str, entry: Any, slot: dt.datetime, task_id: str) -> Any:
        options = dict(self._options[name])
        headers = {
            **(options.pop("headers", None) or {}),
            ENTRY_HEADER: name,
            SLOT_HEADER: slot_iso(slot),
            "celery_beat_task": True,  # what Celery's own beat stamps
        }
        args = beat._evaluate_entry_args(entry.args)
        kwargs = beat._evaluate_entry_kwargs(entry.kwargs)
        task = self.app.tasks.get(entry.task)
        send = task.apply_async if task is not None else self._send_by_name(entry.task)
        return send(
            args, kwargs, producer=self.producer, task_id=task_id, headers=headers, **options
        )

    def _send_by_name(self, task_name: str) -> Callable[..., Any]:
        def send(args: Any, kwargs: Any, **options: Any) -> Any:
            return self.app.send_task(task_name, args, kwargs, **options)

        return send

    def _undo(self, name: str, slot: dt.datetime, task_id: str) -> None:
        try:
            self.markers.release(name, task_id)
            self.records.release(name, slot, self.sender_id)
        except redis.RedisError:
            logger.warning(
                "beat entry %r: could not undo the record of slot %s (Redis down); "
                "it expires by itself",
                name,
                slot_iso(slot),
                extra={"event": "jobs.beat.undo_failed", "entry": name},
            )

    def _run_budget_s(self, entry: Any) -> float:
        task = self.app.tasks.get(entry.task)
        if task is not None:
            return running.run_budget_s(task)
        settings = getattr(self.app, "jobs_settings", None)
        limit = self.app.conf.task_time_limit or getattr(settings, "visibility_timeout", 3600.0)
        return float(limit) + running.queue_wait_s(settings)

    def _skipped(self, name: str, reason: str, count: int, message: str, *args: Any) -> None:
        metrics.SKIPPED.labels(name, reason).inc(count)
        self.state.count_skip(name, reason, count)
        logger.log(
            logging.INFO if reason == "taken" else logging.WARNING,
            "beat entry %r: " + message,
            name,
            *args,
            extra={"event": f"jobs.beat.skipped.{reason}", "entry": name, "count": count},
        )

    # -- leadership ------------------------------------------------------------------------

    def _set_leading(self, leading: bool, *, reason: str = "") -> None:
        role = "leader" if leading else "standby"
        self.leading = leading
        if role == self._role:
            return
        was, self._role = self._role, role
        if leading:
            logger.info(
                "beat %s leads (%s)",
                self.sender_id,
                self.leader.key,
                extra={"event": "jobs.beat.leading"},
            )
            self.state.forget_ticks(self.schedule)
        elif was == "leader":
            logger.warning(
                "beat %s no longer leads%s",
                self.sender_id,
                f": {reason}" if reason else "",
                extra={"event": "jobs.beat.standby"},
            )
        else:
            logger.info(
                "beat %s stands by%s",
                self.sender_id,
                f": {reason}" if reason else f" ({self._current_leader()} leads)",
                extra={"event": "jobs.beat.standby"},
            )

    def _current_leader(self) -> str:
        try:
            return self.leader.current() or "nobody"
        except redis.RedisError:
            return "unknown"

    def close(self) -> None:
        """Hand the lead over at once on a clean stop (the standby need not wait for the TTL)."""
        self._closed = True
        if self.leading:
            try:
                self.leader.release()
                logger.info(
                    "beat %s released the lead",
                    self.sender_id,
                    extra={"event": "jobs.beat.released"},
                )
            except redis.RedisError:
                pass  # the lock expires by itself
            self.leading = False
        # The last sends since the previous flush would otherwise miss the fleet's totals.
        counters.flush()
        super().close()
