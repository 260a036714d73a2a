"""The I/O profile's app (``bench/io_profile.py``): ``ReliableTask`` on ``create_app``, one
task on the ``thirdparty`` queue that waits 50 ms (it yields under gevent, as a socket read
to a partner would)."""

from __future__ import annotations

from typing import Any

from bench.apps._marks import body, broker_url
from jobs_platform import ReliableTask, create_app

SLEEP_S = 0.05


def make_app(url: str) -> tuple[Any, dict[str, Any]]:
    app = create_app("bench_io", broker_url=url)

    @app.task(base=ReliableTask, name="bench.io50ms", queue="thirdparty", ignore_result=True)
    def io50ms(mark: str | None = None) -> None:
        body(mark, SLEEP_S)

    return app, {"io50ms": io50ms}


app, TASKS = make_app(broker_url())
