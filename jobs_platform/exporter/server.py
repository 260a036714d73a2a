"""The HTTP server behind ``celery -A APP metrics``: prometheus-client's, with one registry
holding only :class:`~.collector.JobsCollector`.

The registry is private: the exporter process's own prometheus-client counters (the
platform's counters register there in every process) would otherwise be served next to
the fleet's totals under the same names.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from jobs_platform.exporter.collector import JobsCollector
from jobs_platform.exporter.sources import Sources


def registry_for(app: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobsCollector(Sources.from_app(app)))
    return registry


def exposition(app: Any) -> str:
    """One scrape's text, as the server would answer it."""
    return generate_latest(registry_for(app)).decode()


def serve(app: Any, *, host: str, port: int) -> Any:
    """Start serving ``/metrics`` on ``host:port`` in a thread; the server (call
    ``shutdown()`` to stop it). Raises ``OSError`` when the address is taken."""
    server, _thread = start_http_server(port, addr=host, registry=registry_for(app))
    return server


def run_until_stopped(server: Any) -> None:
    """Block until SIGTERM or SIGINT, then stop ``server`` (a container stops cleanly)."""
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        stopping.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        stopping.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()
        server.server_close()
