"""Variant 1: bare Celery with its defaults (acks early, prefetch 4, no result backend)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from bench.apps._marks import body, broker_url

SLEEP_S = 0.002


def make_app(url: str) -> tuple[Any, dict[str, Any]]:
    app = Celery("bench_default", broker=url, set_as_current=False)

    @app.task(name="bench.noop", ignore_result=True, shared=False)
    def noop(mark: str | None = None) -> None:
        body(mark, 0)

    @app.task(name="bench.sleep2ms", ignore_result=True, shared=False)
    def sleep2ms(mark: str | None = None) -> None:
        body(mark, SLEEP_S)

    return app, {"noop": noop, "sleep2ms": sleep2ms}


app, TASKS = make_app(broker_url())
