"""Variant 2: bare Celery (plain ``@app.task``) with jobs-platform's pinned configuration.

The configuration is ``jobs_platform.app.celery_config`` itself, so it cannot drift, and the
tasks carry the same hard/soft time limits ReliableTask gets from the ``fast`` profile (prefork
arms a timer per task for them): "the same settings" includes them.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from bench.apps._marks import body, broker_url
from jobs_platform.app import celery_config
from jobs_platform.profiles import PROFILES
from jobs_platform.routing import Router
from jobs_platform.settings import Settings

SLEEP_S = 0.002


def make_app(url: str) -> tuple[Any, dict[str, Any]]:
    settings = Settings.load(broker_url=url)
    app = Celery("bench_hardened", set_as_current=False)
    app.config_from_object(celery_config(settings, Router(settings.routes)))

    limits = {
        "time_limit": PROFILES["fast"].time_limit_s,
        "soft_time_limit": PROFILES["fast"].soft_time_limit_s,
    }

    # No route matches "bench.*", so both go to task_default_queue ("fast").
    @app.task(name="bench.noop", ignore_result=True, shared=False, **limits)
    def noop(mark: str | None = None) -> None:
        body(mark, 0)

    @app.task(name="bench.sleep2ms", ignore_result=True, shared=False, **limits)
    def sleep2ms(mark: str | None = None) -> None:
        body(mark, SLEEP_S)

    return app, {"noop": noop, "sleep2ms": sleep2ms}


app, TASKS = make_app(broker_url())
