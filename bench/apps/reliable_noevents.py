"""Informational variant: the ``reliable`` app with task events switched off.

Not a candidate configuration (events are pinned on in ``jobs_platform.app`` for monitoring);
it shows in every run what the pinned events cost on the ``fast`` profile.
"""

from __future__ import annotations

from typing import Any

from bench.apps import reliable
from bench.apps._marks import broker_url


def make_app(url: str) -> tuple[Any, dict[str, Any]]:
    app, tasks = reliable.make_app(url)
    app.conf.update(worker_send_task_events=False, task_send_sent_event=False)
    return app, tasks


app, TASKS = make_app(broker_url())
