"""create_app(): a Celery app with the reliability settings pinned in code.

Workers started with different flags must not behave differently, so everything that
decides whether a job can be lost or repeated is set here: JSON only (pickle refused),
late acknowledgement with redelivery when a worker dies (counted as a retry, so a
message that kills its worker cannot loop forever), declared queues only, and the
visibility timeout in every place kombu reads it, with a short restore sweep (the broker's
part of the configuration comes from :mod:`jobs_platform.brokers`).
"""

from __future__ import annotations

import datetime as dt
from functools import cached_property
from typing import Any

from celery import Celery
from kombu import Exchange, Queue

from jobs_platform import brokers, events, flower, health, metrics, outbox, rules, schedule
from jobs_platform.deadletter import CONSUMER as DEAD_LETTER_CONSUMER
from jobs_platform.deadletter import install as install_dead_letters
from jobs_platform.history import qualified_name
from jobs_platform.idempotency import unique
from jobs_platform.routing import QUEUE_NAMES, Router
from jobs_platform.settings import Settings
from jobs_platform.startup import RefuseUnsafePool, with_queue_check

#: The cheap-retry bootstep (by name: only workers import it).
CHEAP_RETRY_STEP = "jobs_platform.cheap_retry:CheapRetryStep"


class JobsCelery(Celery):  # type: ignore[misc]
    """A Celery app that validates every ReliableTask when it is declared and at start-up."""

    jobs_settings: Settings
    jobs_router: Router

    def task(self, *args: Any, **opts: Any) -> Any:
        # Celery binds decorated tasks lazily (at finalize); binding now makes a bad
        # declaration fail at import, with the offending line in the traceback.
        opts.setdefault("lazy", False)
        # Not shared: a task declared on one app must not appear in every other app.
        opts.setdefault("shared", False)
        from jobs_platform.task import check_task_options

        decorate = super().task(*args, **opts)
        if args:  # bare @app.task: no options to check
            return decorate

        def checked(fun: Any) -> Any:
            label = opts.get("name") or qualified_name(fun)
            check_task_options(opts, task=repr(label))
            return decorate(fun)

        return checked

    @cached_property
    def Worker(self) -> Any:
        return with_queue_check(super().Worker)

    def finalize(self, auto: bool = False) -> None:
        super().finalize(auto=auto)
        self.check_invariants()

    def check_invariants(self) -> None:
        """Refuse to run when the live configuration no longer matches the pinned one."""
        from jobs_platform.task import ReliableTask

        settings = self.jobs_settings
        broker = brokers.of(self)
        broker.check_live(self)  # on Redis: the live visibility timeout is the configured one
        delivery = broker.delivery_timeout(settings)
        for name, task in self._tasks.items():  # not .tasks: that would finalize again
            if isinstance(task, ReliableTask):
                # The limits Celery will apply, which a later setattr could have changed.
                rules.check_task_limits(
                    name,
                    longest_wait_s=task.spec.policy.longest_wait_s,
                    hard_limit_s=task.time_limit,
                    soft_limit_s=task.soft_time_limit,
                    delivery_timeout_s=delivery.seconds if delivery.bounds_running_jobs else None,
                    delivery_timeout_name=delivery.name,
                    margin_s=settings.visibility_margin,
                    max_delay_s=settings.max_delay,
                )


def celery_config(settings: Settings, router: Router) -> dict[str, Any]:
    """The pinned Celery configuration for ``settings``."""
    # A dispatch to an unreachable broker fails within dispatch_timeout: the broker's own
    # connect timeouts (its celery_config); a publish makes at most 3 attempts 0.2 s apart.
    timeout = settings.dispatch_timeout
    return {
        "broker_url": settings.broker_url,
        "result_backend": settings.result_backend_url,
        # The queues (a broker may declare its own: quorum queues on topic exchanges on
        # RabbitMQ), then transport options (the visibility timeout in every place kombu
        # reads it...).
        "task_queues": [Queue(q, Exchange(q, type="direct"), routing_key=q) for q in QUEUE_NAMES],
        **brokers.for_url(settings.broker_url).celery_config(settings),
        "broker_connection_timeout": timeout,
        "task_publish_retry_policy": {
            "max_retries": 2,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.2,
        },
        "broker_connection_retry_on_startup": True,
        # Serialisation: JSON in both directions; pickle would execute attacker-chosen code.
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # At-least-once delivery.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_retry_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        # Queues: declared, never created on the fly.
        "task_create_missing_queues": False,
        "task_default_queue": settings.default_queue,
        "task_default_exchange": settings.default_queue,
        "task_default_routing_key": settings.default_queue,
        "task_routes": (router,),
        # Task events (Flower reads them): in `auto` mode off until a monitor asks for them.
        **events.celery_config(settings.task_events),
        "task_track_started": True,
        "result_extended": True,
        "result_expires": dt.timedelta(seconds=settings.result_expires),
        "enable_utc": True,
        "timezone": "UTC",
        # Records poison messages (unknown task, undecodable, pickle) before Celery drops them.
        "worker_consumer": DEAD_LETTER_CONSUMER,
        # `celery -A APP beat` runs the highly available, once-per-slot scheduler.
        **schedule.celery_config(settings),
    }


def create_app(main: str = "jobs_platform", **overrides: Any) -> JobsCelery:
    """A Celery app from the settings table (``overrides`` > ``JOBS_*`` env > defaults)."""
    settings = Settings.load(**overrides)
    router = Router(settings.routes)
    app = JobsCelery(main, set_as_current=False)
    app.jobs_settings = settings
    app.jobs_router = router
    app.config_from_object(celery_config(settings, router))
    # A pool that ignores hard time limits would void the visibility-timeout invariant.
    app.steps["worker"].add(RefuseUnsafePool)
    # Retries end without frame copies (a patch of one Celery name; said if it cannot).
    app.steps["worker"].add(CHEAP_RETRY_STEP)
    # Unique-dispatch locks go when their job ends (connected once per process).
    unique.connect_receivers()
    # Dead letters: terminal failures stored once (drainer bootstep + signal receivers).
    install_dead_letters(app)
    # The broker's worker plug-ins (on Redis: every worker releases due delayed jobs).
    brokers.for_url(settings.broker_url).install(app)
    # Every worker relays the committed delay_on_commit jobs.
    outbox.install(app)
    # Beat's overlap markers and the platform's maintenance tasks.
    schedule.install(app)
    # Counters from Celery signals (not task events), summed in Redis for `metrics`.
    metrics.install(app)
    # The canary task every worker runs for `health`.
    health.install(app)
    # Task events while a monitor listens (JOBS_TASK_EVENTS=auto), or always, or never.
    events.install(app)
    # `celery -A APP flower`: persistent, authenticated, checked before it binds.
    flower.install(app)
    return app
