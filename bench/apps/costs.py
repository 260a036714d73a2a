"""The cost table's apps (``bench/costs.py``): bare Celery with one pinned setting toggled.

``BENCH_COST_VARIANT`` picks the variant a worker runs; the orchestrator builds the same
app to publish. Every variant has a no-op and a 2-ms task with ``ignore_result=True``, except
the result-backend ones (a setting about results costs nothing when none is stored).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from celery import Celery

from bench.apps._marks import body, broker_url
from jobs_platform.profiles import PROFILES

SLEEP_S = 0.002
FAST = PROFILES["fast"]


def _settings(app: Any, url: str) -> None:
    """The platform's settings table on a bare app: its bootsteps read it."""
    from jobs_platform.settings import Settings

    app.jobs_settings = Settings.load(broker_url=url)


def _deadletter_consumer(app: Any, url: str) -> None:
    from jobs_platform.deadletter import CONSUMER

    _settings(app, url)
    app.conf.worker_consumer = CONSUMER


def _drainer(app: Any, url: str) -> None:
    from jobs_platform.deadletter import install

    _settings(app, url)
    install(app)  # the drainer bootstep and the (failure-only) signal receivers


def _metrics(app: Any, url: str) -> None:
    from jobs_platform import metrics

    _settings(app, url)
    metrics.install(app)  # the recording bootstep and the outcome receivers


def _delayed(app: Any, url: str) -> None:
    from jobs_platform.brokers.redis import BROKER, TRANSPORT, options

    _settings(app, url)
    # The store's transport and its options, the releaser bootstep, revoke.
    app.conf.broker_transport = TRANSPORT
    app.conf.broker_transport_options = {
        **(app.conf.broker_transport_options or {}),
        **options.transport_options(app.jobs_settings),
    }
    BROKER.install(app)


def _results(app: Any, url: str, **extra: Any) -> None:
    app.conf.update(result_backend=url, **extra)


#: variant -> (what it adds to Celery's defaults, how, whether results are stored)
VARIANTS: dict[str, tuple[str, Callable[[Any, str], None], bool]] = {
    "defaults": ("Celery defaults (acks early, prefetch 4, no results)", lambda a, u: None, False),
    "events": (
        "task events on (worker_send_task_events, task_send_sent_event)",
        lambda a, u: a.conf.update(worker_send_task_events=True, task_send_sent_event=True),
        False,
    ),
    "acks_late": ("task_acks_late", lambda a, u: a.conf.update(task_acks_late=True), False),
    "prefetch1": (
        "worker_prefetch_multiplier 1",
        lambda a, u: a.conf.update(worker_prefetch_multiplier=1),
        False,
    ),
    "time_limits": (
        f"time limits ({FAST.soft_time_limit_s:g} s / {FAST.time_limit_s:g} s per task)",
        lambda a, u: None,
        False,
    ),
    "results": ("Redis result backend, results stored", _results, True),
    "track_started": (
        "results + task_track_started",
        lambda a, u: _results(a, u, task_track_started=True),
        True,
    ),
    "result_extended": (
        "results + result_extended",
        lambda a, u: _results(a, u, result_extended=True),
        True,
    ),
    "consumer": (
        "worker_consumer: the dead-letter consumer and request",
        _deadletter_consumer,
        False,
    ),
    "drainer": ("the dead-letter drainer bootstep", _drainer, False),
    "metrics": ("metrics recording (bootstep + signal receivers)", _metrics, False),
    "delayed": ("delayed jobs (transport, releaser bootstep)", _delayed, False),
}
#: Variants whose row is compared with "results" rather than "defaults".
ON_RESULTS = frozenset({"track_started", "result_extended"})
PLATFORM = "platform"


def make_app(url: str, variant: str) -> tuple[Any, dict[str, Any], str]:
    """(app, tasks by kind, queue) for ``variant``."""
    if variant == PLATFORM:
        return _platform_app(url)
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: {', '.join([*VARIANTS, PLATFORM])}")
    _, configure, stores = VARIANTS[variant]
    app = Celery(f"bench_cost_{variant}", broker=url, set_as_current=False)
    configure(app, url)
    limits: dict[str, Any] = {}
    if variant == "time_limits":
        limits = {"time_limit": FAST.time_limit_s, "soft_time_limit": FAST.soft_time_limit_s}
    options = {"ignore_result": not stores, "shared": False, **limits}

    @app.task(name="bench.noop", **options)
    def noop(mark: str | None = None) -> None:
        body(mark, 0)

    @app.task(name="bench.sleep2ms", **options)
    def sleep2ms(mark: str | None = None) -> None:
        body(mark, SLEEP_S)

    return app, {"noop": noop, "sleep2ms": sleep2ms}, "celery"


def _platform_app(url: str) -> tuple[Any, dict[str, Any], str]:
    """The full platform: ``ReliableTask`` on ``create_app`` (as ``bench/apps/reliable.py``)."""
    from bench.apps import reliable

    app, tasks = reliable.make_app(url)
    return app, tasks, "fast"


app, TASKS, QUEUE = make_app(broker_url(), os.environ.get("BENCH_COST_VARIANT", "defaults"))
