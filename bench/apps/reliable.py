"""Variants 3 and 4 (and the per-queue memory workers): ``ReliableTask`` on ``create_app``,
with everything ``create_app`` installs (metrics and health bootsteps, dead letters, delayed
jobs) and the default ``JOBS_TASK_EVENTS=auto``: the monitoring a user gets by default."""

from __future__ import annotations

from typing import Any

from bench.apps._marks import body, broker_url
from jobs_platform import ReliableTask, create_app

SLEEP_S = 0.002


def make_app(url: str, **settings: Any) -> tuple[Any, dict[str, Any]]:
    app = create_app("bench_reliable", broker_url=url, **settings)

    @app.task(base=ReliableTask, name="bench.noop", queue="fast", ignore_result=True)
    def noop(mark: str | None = None) -> None:
        body(mark, 0)

    @app.task(base=ReliableTask, name="bench.sleep2ms", queue="fast", ignore_result=True)
    def sleep2ms(mark: str | None = None) -> None:
        body(mark, SLEEP_S)

    return app, {"noop": noop, "sleep2ms": sleep2ms}


app, TASKS = make_app(broker_url())
