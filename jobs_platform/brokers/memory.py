"""``memory://``: kombu's in-process transport, for pure unit tests (no worker runs on it).

An app on it is declared and configured exactly as on Redis (the same pinned delivery
options and checks, so declaration tests see the configuration a real worker gets), but
nothing waits in a store, no worker plug-in is installed, and there is no queue to read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from jobs_platform.brokers.interface import (
    FairKey,
    InflightState,
    PublishSession,
    QueueState,
    Sweep,
)
from jobs_platform.brokers.redis import RedisBroker, options
from jobs_platform.brokers.redis.publish import PipelinedSession
from jobs_platform.errors import ConfigError

SCHEME = "memory"
URL = "memory://"


class MemoryBroker(RedisBroker):
    name = "in-process (memory://)"
    #: A fairness_key task declares here as on Redis (unit tests import the app's real
    #: tasks); no worker runs on this transport, so nothing is taken round robin.
    no_fair_queues: str | None = None

    def check_url(self, url: str, *, setting: str) -> None:
        if url != URL:
            raise ConfigError(f"{setting}: the in-process broker is spelt {URL!r}, got {url!r}")

    def celery_config(self, settings: Any) -> dict[str, Any]:
        config = super().celery_config(settings)
        del config["broker_transport"]  # kombu's own memory transport, and no delayed store
        for name in options.transport_options(settings):
            del config["broker_transport_options"][name]
        return config

    def install(self, app: Any) -> None:
        pass

    def queue_states(self, app: Any, queues: Sequence[str]) -> Mapping[str, QueueState]:
        return {queue: QueueState(0, None) for queue in queues}

    def inflight(self, app: Any) -> InflightState | None:
        return None

    def fair_keys(self, app: Any, queues: Sequence[str]) -> list[FairKey]:
        return []

    def ping(self, url: str, timeout_s: float) -> tuple[bool, str]:
        return True, "in-process broker"

    def reach(self, app: Any, channel: Any) -> None:
        pass

    def publish_session(self, channel: Any) -> PublishSession:
        return PipelinedSession(channel)  # kombu's memory channel: one publish at a time

    def delayed_store(self, app: Any) -> None:
        return None

    def restore_sweep(self, worker: Any) -> Sweep | None:
        return None


BROKER = MemoryBroker()
