"""The bootsteps: what a worker on a cooperative (gevent) pool needs, and the lost-attempt
accounting every worker runs."""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker.components import Pool
from celery.worker.consumer.events import Events

from jobs_platform import brokers, coordination
from jobs_platform.brokers.interface import Sweep
from jobs_platform.cooperative.policy import (
    COOPERATIVE_POOLS,
    broker_connections,
    grace_for,
)
from jobs_platform.cooperative.watchdog import LostAttempts, Monitor
from jobs_platform.startup import pool_name

logger = logging.getLogger("jobs_platform.cooperative")


def is_cooperative(pool_cls: Any) -> bool:
    return pool_name(pool_cls) in COOPERATIVE_POOLS


class Cooperative(bootsteps.StartStopStep):  # type: ignore[misc]
    """Lost-attempt accounting in every worker; in a cooperative pool also the watchdog, the
    restore sweep, a broker connection pool as large as the pool, one shared result backend
    and buffered task events."""

    label = "jobs-platform cooperative pool"
    # After the pool step (it sets ``process_task``), before the consumer (it takes it).
    # A class, not a name: Celery resolves names only for the steps it was given.
    requires = (Pool,)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.cooperative = is_cooperative(worker.pool_cls)
        self.monitor: Monitor | None = None
        self.sweep: Sweep | None = None
        if self.cooperative:
            # Before any connection exists: the consumer's is made when it starts.
            conf = worker.app.conf
            options = dict(conf.broker_transport_options or {})
            options["max_connections"] = broker_connections(
                int(worker.concurrency or 1), options.get("max_connections")
            )
            conf.broker_transport_options = options
            # Celery keeps one result backend per thread, and gevent makes every greenlet a
            # thread: without this each job built a backend of its own (a Redis client and
            # pool), most of a job's CPU. The Redis backend's client is safe to share.
            conf.result_backend_thread_safe = True
            worker.app.steps["consumer"].add(BufferTaskEvents)

    def create(self, worker: Any) -> Cooperative:
        worker.process_task = LostAttempts(worker.app, worker.process_task)
        if self.cooperative:
            app = worker.app
            settings = app.jobs_settings
            broker = brokers.of(app)
            self.monitor = Monitor(
                coordination_url=coordination.url_of(settings),
                hostname=str(worker.hostname),
                grace_s=grace_for(settings.visibility_margin),
                budget_s=broker.delivery_timeout(settings).seconds - settings.visibility_margin,
                default_limit_s=worker.time_limit,
            )
            self.sweep = broker.restore_sweep(worker)
        return self

    def start(self, worker: Any) -> None:
        if self.monitor is None:
            return  # prefork: the pool kills a child at its hard limit
        worker.timer.call_repeatedly(self.monitor.tick_s, self.monitor.beat)
        self.monitor.start()
        if self.sweep is not None:
            worker.timer.call_repeatedly(self.sweep.interval_s, self.sweep)
        logger.info(
            "jobs.watchdog.started: jobs past their hard limit + %g s end this worker",
            self.monitor.grace_s,
            extra={"event": "jobs.watchdog.started"},
        )

    # No stop(): the monitor must keep watching while a warm shutdown waits for the jobs
    # (the pool stops after this step); it ends with the process.
    def stop(self, worker: Any) -> None:
        pass

    def terminate(self, worker: Any) -> None:
        pass


class BufferTaskEvents(bootsteps.StartStopStep):  # type: ignore[misc]
    """Task events buffered and sent in batches (``task.multi``), as Celery does with an event
    loop (prefork) and not without one ("XXX This excludes eventlet/gevent, which should
    actually buffer", ``celery/worker/consumer/events.py``).

    Unbuffered, every job's three events are three publishes, one at a time behind the
    dispatcher's lock: in a gevent worker that lock, not the CPU, capped throughput. A
    buffered event schedules one flush on the timer (its greenlet runs after the ones that
    are ready), so events that arrive together leave together; a full buffer (24) is sent
    at once. Monitors read ``task.multi`` like any event (Flower does).
    """

    label = "jobs-platform buffered task events"
    requires = (Events,)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self._flush_pending = False
        self._consumer: Any = None

    def start(self, consumer: Any) -> None:
        dispatcher = consumer.event_dispatcher
        if dispatcher is None or consumer.hub is not None:
            return  # events off, or an event loop that buffers them already
        self._consumer = consumer
        dispatcher.buffer_group = frozenset({"task"})
        dispatcher.on_send_buffered = self._schedule_flush

    def _schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self._consumer.timer.call_after(0.0, self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        dispatcher = self._consumer.event_dispatcher
        if dispatcher is not None:
            dispatcher.flush(errors=False, groups=True)

    def stop(self, consumer: Any) -> None:
        dispatcher = consumer.event_dispatcher
        if dispatcher is not None and self._consumer is not None:
            dispatcher.flush(errors=False, groups=True)

    def shutdown(self, consumer: Any) -> None:
        self.stop(consumer)
