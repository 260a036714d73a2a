"""Reading RabbitMQ over AMQP (no management API): queue depths, a ping, bulk's publishes.

- :func:`ready_counts`: a passive ``queue_declare`` per queue returns its ready messages at
  a flat cost (one round trip each, on one short connection). A queue not declared yet
  (no worker started) counts 0.
- :func:`ping`: open a connection and a channel within the timeout (each URL of a failover
  list in turn: the first that answers).
- :class:`OneByOneSession`: AMQP has no pipeline; with ``confirm_publish`` each message is
  confirmed by the broker before the next goes, so a failure leaves at most one uncertain.
  A delayed message (an ``eta`` header) is routed through the delayed-delivery levels here,
  because bulk dispatch copies a kind's first message and each copy has its own ETA.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from amqp.exceptions import NotFound
from kombu import Connection
from kombu.transport.native_delayed_delivery import calculate_routing_key

from jobs_platform.brokers.rabbitmq import delays
from jobs_platform.clock import utcnow
from jobs_platform.urls import masked

#: The exchange Celery publishes every delayed message to (the top level).
DELAYED_ENTRY = "celery_delayed_27"


def ready_counts(app: Any, queues: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    with app.connection_for_read() as connection:
        channel = connection.channel()
        try:
            for queue in queues:
                try:
                    _, ready, _ = channel.queue_declare(queue=queue, passive=True)
                except NotFound:  # not declared yet: nothing waits in it
                    ready = 0
                    channel = connection.channel()  # the broker closed the channel
                counts[queue] = int(ready)
        finally:
            with contextlib.suppress(Exception):  # closed by the broker already
                channel.close()
    return counts


def ping(url: str, timeout_s: float) -> tuple[bool, str]:
    said = "no URL"
    for one in [part.strip() for part in url.split(";") if part.strip()]:
        start = time.monotonic()
        try:
            with Connection(one, connect_timeout=timeout_s) as connection:
                connection.ensure_connection(max_retries=1, timeout=timeout_s)
                connection.channel().close()
        except Exception as exc:
            said = f"{masked(one)} does not answer: {type(exc).__name__}: {exc}"
            continue
        took = (time.monotonic() - start) * 1000
        return True, f"{masked(one)} opened a channel in {took:.0f} ms"
    return False, said


class OneByOneSession:
    """Bulk's messages published one at a time, each confirmed (module doc)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel

    @property
    def pipelined(self) -> bool:
        return False

    def publish(self, message: Any, **options: Any) -> None:
        headers = (getattr(message, "properties", None) or {}).get("application_headers") or {}
        routing_key = str(options.get("routing_key") or "")
        if routing_key and "eta" in headers:
            options = {**options, **route_delayed(routing_key, headers.get("eta"))}
        self.channel.basic_publish(message, **options)

    def flush(self) -> None:
        pass

    def close(self, *, discard: bool) -> None:
        pass


def route_delayed(routing_key: str, eta: Any) -> dict[str, str]:
    """Exchange and routing key of a message due at ``eta`` (None: now) whose queue's
    routing key is ``routing_key`` (maybe already carrying a delay prefix)."""
    base = delays.queue_key(routing_key)
    wait = delays.whole_seconds(delays.seconds_until(eta, utcnow())) if eta else 0
    if wait:
        return {"exchange": DELAYED_ENTRY, "routing_key": calculate_routing_key(wait, base)}
    # Each work queue has a topic exchange of its own name (topology.py).
    return {"exchange": base, "routing_key": base}
