"""Informational variant: the ``reliable`` app with task events always on
(``JOBS_TASK_EVENTS=on``): what a ``fast`` worker costs while a monitor such as Flower
listens (in the default ``auto`` mode it sends them only then)."""

from __future__ import annotations

from typing import Any

from bench.apps import reliable
from bench.apps._marks import broker_url


def make_app(url: str) -> tuple[Any, dict[str, Any]]:
    return reliable.make_app(url, task_events="on")


app, TASKS = make_app(broker_url())
