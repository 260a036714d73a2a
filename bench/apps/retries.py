"""The retry benchmark's apps (``bench/retries.py``): one task that fails its first attempt.

``BENCH_RETRY_VARIANT`` picks the variant a worker runs; the orchestrator builds the same app
to publish. Every variant has two tasks on the same queue: ``ok`` (never fails) and ``fail1``
(raises :class:`Flaky` on its first attempt, succeeds on the retry), both with
``ignore_result=True`` as in the other benchmarks, and the ``fast`` profile's time limits.

* ``celery``: bare Celery with its defaults, ``autoretry_for=(Flaky,)``, no backoff,
  ``default_retry_delay=0``: the retry is re-published at once.
* ``celery_pinned``: the same task on the platform's pinned configuration
  (``jobs_platform.app.celery_config``: acks late, prefetch 1, result backend, task events
  ``auto``: off while no monitor asks).
* ``reliable``: ``ReliableTask`` on ``create_app``, ``Flaky`` listed in ``transient_errors``,
  the shortest backoff the policy accepts (1 ms, no jitter).
* ``reliable_celery_retry`` (information): the same, but each retry goes through Celery's
  ``Task.retry`` as ReliableTask's did before (frames copied and formatted, chained error),
  so every run shows what the cheap end of a retry saves.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from bench.apps._marks import body, broker_url
from jobs_platform.profiles import PROFILES

FAST = PROFILES["fast"]
LIMITS = {"time_limit": FAST.time_limit_s, "soft_time_limit": FAST.soft_time_limit_s}
MAX_RETRIES = 3
#: ReliableTask's backoff must be > 0 (a retry that waits 0 s is refused): the smallest step.
RELIABLE_BACKOFF_S = 0.001
VARIANTS = ("celery", "celery_pinned", "reliable", "reliable_celery_retry")


class Flaky(Exception):
    """The transient failure every ``fail1`` task raises once."""


def _fail_once(request: Any) -> None:
    if request.retries == 0:
        raise Flaky("the gateway did not answer (first attempt)")


def make_app(url: str, variant: str) -> tuple[Any, dict[str, Any], str]:
    """(app, tasks by kind, queue) for ``variant``."""
    if variant in ("reliable", "reliable_celery_retry"):
        return _reliable_app(url, variant)
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: {', '.join(VARIANTS)}")
    app = Celery(f"bench_retry_{variant}", broker=url, set_as_current=False)
    queue = "celery"
    if variant == "celery_pinned":
        from jobs_platform.app import celery_config
        from jobs_platform.routing import Router
        from jobs_platform.settings import Settings

        settings = Settings.load(broker_url=url)
        app.config_from_object(celery_config(settings, Router(settings.routes)))
        queue = settings.default_queue  # no route matches "bench.*"
    options: dict[str, Any] = {
        "ignore_result": True,
        "shared": False,
        "bind": True,
        "max_retries": MAX_RETRIES,
        **LIMITS,
    }

    @app.task(name="bench.ok", **options)
    def ok(self: Any, mark: str | None = None) -> None:
        body(mark, 0)

    @app.task(
        name="bench.fail1",
        autoretry_for=(Flaky,),
        retry_backoff=False,
        retry_jitter=False,
        default_retry_delay=0,
        **options,
    )
    def fail1(self: Any, mark: str | None = None) -> None:
        _fail_once(self.request)
        body(mark, 0)

    return app, {"ok": ok, "fail1": fail1}, queue


def _reliable_app(url: str, variant: str) -> tuple[Any, dict[str, Any], str]:
    from jobs_platform import ReliableTask, create_app

    app = create_app(f"bench_retry_{variant}", broker_url=url)
    options: dict[str, Any] = {
        "base": ReliableTask if variant == "reliable" else _celery_retry_base(),
        "bind": True,
        "queue": "fast",
        "ignore_result": True,
        "max_retries": MAX_RETRIES,
        "retry_backoff": RELIABLE_BACKOFF_S,
        "retry_backoff_max": RELIABLE_BACKOFF_S,
        "retry_jitter": False,
        "transient_errors": (Flaky,),
    }

    @app.task(name="bench.ok", **options)
    def ok(self: Any, mark: str | None = None) -> None:
        body(mark, 0)

    @app.task(name="bench.fail1", **options)
    def fail1(self: Any, mark: str | None = None) -> None:
        _fail_once(self.request)
        body(mark, 0)

    return app, {"ok": ok, "fail1": fail1}, "fast"


def _celery_retry_base() -> Any:
    """ReliableTask with its retry published by Celery's ``Task.retry``, as it was before the
    cheap end of a retry (jobs_platform.cheap_retry): the Retry is raised inside this
    helper, inside ``__call__``'s except block, so Celery copies four frames and formats the
    chained error."""
    from jobs_platform import ReliableTask

    class CeleryRetryTask(ReliableTask):  # type: ignore[misc]
        def _publish_retry(self, exc: Exception, attempt: int, step: Any) -> Any:
            from jobs_platform import history

            request = self.request
            raise self.retry(
                exc=exc,
                countdown=step.delay_s,
                queue=self._queue_of(request),
                priority=(request.delivery_info or {}).get("priority"),
                headers=history.with_error(request.headers, history.describe(exc, attempt)),
            )

    return CeleryRetryTask


def _profile_processes(directory: str) -> None:
    """cProfile the worker's main process and every pool child into ``directory`` (one
    ``.prof`` per process, written when it stops): ``BENCH_PROFILE_DIR`` only."""
    import cProfile

    from celery import signals

    profiler = cProfile.Profile(time.process_time)  # CPU, not wall: the machine is shared
    variant = os.environ.get("BENCH_RETRY_VARIANT", "celery")

    def start(role: str) -> Any:
        def receiver(**_: Any) -> None:
            profiler.enable()
            profiler.role = role  # type: ignore[attr-defined]

        return receiver

    def dump(**_: Any) -> None:
        profiler.disable()
        role = getattr(profiler, "role", "main")
        profiler.dump_stats(os.path.join(directory, f"{variant}-{role}-{os.getpid()}.prof"))

    signals.worker_ready.connect(start("main"), weak=False)
    signals.worker_shutdown.connect(dump, weak=False)
    signals.worker_process_init.connect(start("child"), weak=False)
    signals.worker_process_shutdown.connect(dump, weak=False)


if os.environ.get("BENCH_PROFILE_DIR"):
    _profile_processes(os.environ["BENCH_PROFILE_DIR"])
app, TASKS, QUEUE = make_app(broker_url(), os.environ.get("BENCH_RETRY_VARIANT", "celery"))
