"""The watchdog: end a cooperative-pool worker that a job holds past its hard limit.

In a gevent worker every job runs on the main process's event loop. A :class:`Monitor`
thread (a real OS thread, started with the original ``_thread.start_new_thread``: gevent
patches ``threading``, and a greenlet would be as stuck as the loop) looks every tick at
the running jobs. When one has outlived its hard limit + grace, gevent's Timeout could not
stop it (it never yields, or it swallowed the Timeout): the monitor writes what it found
and the main thread's stack to stderr, marks the overdue jobs as lost (coordination), and
ends the process with ``os._exit`` (a clean shutdown would need the blocked loop).

Every worker, whatever its pool, wraps the hand-over of a request to the pool
(:class:`LostAttempts`): a *redelivered* message that carries such a mark is not run
again but failed with ``WorkerLostError``, exactly as Celery handles a lost prefork
child: retried with ``retries + 1`` and a "worker lost" entry in its history (ReliableTask),
or, once ``max_retries`` is spent, failed and dead-lettered ``worker_lost``. Messages that
were not redelivered cost one dict lookup.
"""

from __future__ import annotations

import _thread
import importlib
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import redis
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery.worker import state

from jobs_platform import coordination, history, process_local, redis_urls
from jobs_platform.cooperative.policy import (
    EXIT_STATUS,
    LOST_MARK_TTL_S,
    Running,
    describe,
    lost_key,
    overdue,
    tick_for,
)
from jobs_platform.deadletter import spool

logger = logging.getLogger("jobs_platform.cooperative")

#: Socket timeouts of the monitor's one broker write: it must exit even if Redis is gone.
MARK_TIMEOUT_S = 2.0


def _native() -> tuple[Callable[..., Any], Callable[[float], None], Callable[[], int]]:
    """``start_new_thread``, ``sleep`` and ``get_ident`` as they were before gevent patched
    them (the plain ones when gevent is not installed)."""
    try:
        monkey = importlib.import_module("gevent.monkey")
    except ImportError:
        return _thread.start_new_thread, time.sleep, _thread.get_ident
    return (
        monkey.get_original("_thread", "start_new_thread"),
        monkey.get_original("time", "sleep"),
        monkey.get_original("_thread", "get_ident"),
    )


def running_jobs(requests: Any = None, default_limit_s: float | None = None) -> list[Running]:
    """What the worker runs now (Celery's active requests), read from another thread."""
    requests = state.active_requests if requests is None else requests
    for _ in range(10):
        try:
            snapshot = list(requests)
            break
        except RuntimeError:  # the set changed while it was copied: the loop is alive
            continue
    else:
        return []
    jobs = []
    for req in snapshot:
        started = req.time_start
        if not started:
            continue
        hard = (req.time_limits or (None, None))[0] or req.task.time_limit or default_limit_s
        jobs.append(Running(str(req.id), str(req.name), float(started), hard))
    return jobs


class Monitor:
    """The native thread that ends the worker when a job outlives its hard limit + grace."""

    def __init__(
        self,
        *,
        coordination_url: str,
        hostname: str,
        grace_s: float,
        budget_s: float,
        default_limit_s: float | None = None,
        exit: Callable[[int], Any] = os._exit,
    ) -> None:
        self.coordination_url = coordination_url
        self.hostname = hostname
        self.grace_s = grace_s
        self.budget_s = budget_s
        self.tick_s = tick_for(grace_s)
        self.default_limit_s = default_limit_s
        self._exit = exit
        self.loop_seen = time.monotonic()
        self._main_ident: int | None = None

    def beat(self) -> None:
        """Called on the event loop every tick: when it last ran is in the report."""
        self.loop_seen = time.monotonic()

    def start(self) -> None:
        start_new_thread, sleep, get_ident = _native()
        self._main_ident = get_ident()
        start_new_thread(self._run, (sleep,))

    def _run(self, sleep: Callable[[float], None]) -> None:
        while True:
            sleep(self.tick_s)
            late = self.check()
            if late:
                self.end_worker(late)
                return

    def check(self) -> list[Running]:
        return overdue(
            running_jobs(default_limit_s=self.default_limit_s),
            now=time.time(),
            grace_s=self.grace_s,
            budget_s=self.budget_s,
        )

    def end_worker(self, late: list[Running]) -> None:
        blocked_s = time.monotonic() - self.loop_seen
        self._say(
            f"CRITICAL jobs.watchdog.worker_ended: {self.hostname}: "
            f"{describe(late, now=time.time())}: past the hard limit + {self.grace_s:g} s grace "
            f"(the event loop last ran {blocked_s:.1f} s ago: the job "
            f"{'never yields' if blocked_s > self.grace_s else 'swallowed the time limit'}); "
            f"ending the worker (exit {EXIT_STATUS}) so the broker redelivers its messages "
            "and this attempt counts as a lost worker.\n"
            f"Main thread:\n{self._main_stack()}"
        )
        self.mark_lost(late)
        self._exit(EXIT_STATUS)

    def mark_lost(self, late: list[Running]) -> None:
        """One broker write, from this thread, on a connection of its own (the loop's are
        stuck); a failure is reported and the worker still ends."""
        try:
            client = redis_urls.client(
                self.coordination_url,
                socket_timeout=MARK_TIMEOUT_S,
                socket_connect_timeout=MARK_TIMEOUT_S,
            )
            with client.pipeline(transaction=False) as pipe:
                for job in late:
                    pipe.set(lost_key(job.task_id), self.hostname, ex=LOST_MARK_TTL_S)
                pipe.execute()
            client.close()
        except Exception as exc:
            self._say(
                f"ERROR jobs.watchdog.mark_failed: the lost attempt(s) could not be marked "
                f"({exc!r}); the redelivery will run them again without counting"
            )

    def _main_stack(self) -> str:
        frame = sys._current_frames().get(self._main_ident or -1)
        return "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)\n"

    @staticmethod
    def _say(text: str) -> None:
        # Straight to the file descriptor: the logging module's locks are gevent locks,
        # and the main thread that could release one is the one that is stuck.
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.write(2, f"[{stamp}] {text}\n".encode(errors="replace"))


class LostAttempts:
    """``process_task`` that screens a job delivered again before it runs:

    - a job whose final failure was already recorded (its dead mark,
      :mod:`jobs_platform.deadletter.spool`: the worker died right after storing the letter,
      and Celery retried it) is acknowledged without running: never both dead-lettered and
      succeeded;
    - a redelivered message marked lost is failed instead of run: marked by the watchdog
      (past its hard limit), or put back because the worker that held it lost its lease
      (:data:`jobs_platform.history.LOST_WORKER_HEADER`).

    A first delivery (no retries, not redelivered) costs two dict lookups.
    """

    def __init__(self, app: Any, process_task: Callable[[Any], Any]) -> None:
        self.app = app
        self.process_task = process_task

    def __call__(self, req: Any) -> Any:
        redelivered = bool((req.delivery_info or {}).get("redelivered"))
        fields = getattr(req, "request_dict", None) or {}
        if (redelivered or fields.get("retries")) and self._was_dead_lettered(str(req.id)):
            return self._skip_dead(req)
        if not redelivered:
            return self.process_task(req)
        # Both looked at: the watchdog's mark is consumed either way (one count, not two).
        past_limit = self._was_lost(str(req.id))
        owner = fields.get(history.LOST_WORKER_HEADER)
        if owner:
            return self._count_lost(req, f"the worker holding it ({owner}) lost its lease")
        if past_limit:
            return self._count_lost(req, "it held a worker past its hard limit")
        return self.process_task(req)

    def _was_dead_lettered(self, task_id: str) -> bool:
        try:
            client = process_local.redis_client(coordination.url_of(self.app.jobs_settings))
            return bool(client.exists(spool.dead_mark_key(task_id)))
        except redis.RedisError:
            logger.warning(
                "jobs.dlq.dead_mark_unreadable: could not read the dead mark of %s; running it",
                task_id,
                exc_info=True,
                extra={"event": "jobs.dlq.dead_mark_unreadable", "task_id": task_id},
            )
            return False

    @staticmethod
    def _skip_dead(req: Any) -> None:
        logger.warning(
            "jobs.dlq.already_dead: %s[%s] was dead-lettered already (its worker died after "
            "storing the letter); this delivery is acknowledged without running",
            req.name,
            req.id,
            extra={"event": "jobs.dlq.already_dead", "task_id": req.id},
        )
        state.task_ready(req)
        req.acknowledge()

    def _was_lost(self, task_id: str) -> bool:
        try:
            client = process_local.redis_client(coordination.url_of(self.app.jobs_settings))
            return client.getdel(lost_key(task_id)) is not None
        except redis.RedisError:
            logger.warning(
                "jobs.watchdog.mark_unreadable: could not read the lost-attempt mark of %s; "
                "running it again without counting",
                task_id,
                exc_info=True,
                extra={"event": "jobs.watchdog.mark_unreadable", "task_id": task_id},
            )
            return False

    @staticmethod
    def _count_lost(req: Any, why: str) -> Any:
        logger.warning(
            "jobs.watchdog.lost_attempt: %s[%s]: %s; counted as a lost worker",
            req.name,
            req.id,
            why,
            extra={"event": "jobs.watchdog.lost_attempt", "task_id": req.id},
        )
        try:
            raise WorkerLostError(f"Worker lost: {why}")
        except WorkerLostError:
            einfo = ExceptionInfo()
        # Celery's own lost-worker path: retry (retries + 1) or fail and dead-letter.
        return req.on_failure(einfo)
