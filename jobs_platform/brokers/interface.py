"""What the platform asks of the broker behind its queues (pure: no Celery, no client).

The rest of the platform talks to a :class:`Broker` and never to a transport: the app
takes its Celery configuration and worker plug-ins from it, the start-up checks their
delivery-timeout invariant, ``health`` and the exporter their queue readings, dispatch
its "is the broker down" verdict, ``delayed`` and revoke the store of long delays. Adding
a broker means adding a package beside :mod:`jobs_platform.brokers.redis` that provides
all of it, and a scheme in :mod:`jobs_platform.brokers`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

#: The header carrying a message's fairness key (a ``fairness_key`` task's): a broker that
#: serves fair queues takes a queue's keyed messages round robin across the keys.
FAIRNESS_HEADER = "jobs_fair_key"


@dataclasses.dataclass(frozen=True)
class QueueState:
    """One queue's waiting jobs."""

    length: int
    #: Unix time of the oldest waiting job's enqueue stamp; ``None`` when the queue is
    #: empty, its oldest jobs carry no stamp, or the broker cannot tell.
    oldest_enqueued_at: float | None


@dataclasses.dataclass(frozen=True)
class FairKey:
    """A fairness key with jobs waiting on one queue."""

    queue: str
    key: str
    backlog: int
    #: Its place in the queue's rotation: 0 is served next.
    position: int


@dataclasses.dataclass(frozen=True)
class InflightState:
    """Jobs taken by workers and not yet acknowledged."""

    total: int
    by_queue: dict[str, int]
    #: Unix time the oldest in-flight job of each queue was fetched.
    oldest_fetched_at: dict[str, float]


@dataclasses.dataclass(frozen=True)
class DeliveryTimeout:
    """How long the broker lets a worker hold a job unacknowledged before giving it to
    another worker."""

    #: What the broker calls it, for messages ("visibility timeout").
    name: str
    #: The setting that sets it.
    setting: str
    seconds: float
    #: Whether a job still running when it passes is given to another worker (then every
    #: hard time limit must end before it); False when only a lost worker's jobs are.
    bounds_running_jobs: bool = True


class DelayedStore(Protocol):
    """Jobs waiting for a countdown or ETA outside the queues (where the broker has one)."""

    def count(self) -> int: ...

    def next_due_s(self) -> tuple[int, float | None]:
        """How many jobs wait, and when the next is due (Unix seconds; None: none)."""

    def scan(
        self, *, due_after_ms: float | None = None, due_before_ms: float | None = None
    ) -> Iterator[Any]: ...

    def get(self, task_id: str) -> Any: ...

    def cancel(self, task_id: str) -> Any: ...


class PublishSession(Protocol):
    """Messages of one bulk dispatch on one channel: written together at :meth:`flush`."""

    channel: Any

    @property
    def pipelined(self) -> bool: ...

    def publish(self, message: dict[str, Any], **options: Any) -> None: ...

    def flush(self) -> None: ...

    def close(self, *, discard: bool) -> None: ...


class Sweep(Protocol):
    """Worker upkeep a timer runs every :attr:`interval_s` seconds."""

    interval_s: float

    def __call__(self) -> None: ...


class Broker(Protocol):
    """Everything the platform needs to know about one kind of broker."""

    #: For messages: "Redis".
    name: str
    #: The highest message priority this broker serves first.
    highest_priority: int
    #: Why this broker cannot take a queue's jobs round robin across fairness keys
    #: (``fairness_key`` is refused at declaration with it); None when it can.
    no_fair_queues: str | None

    # -- configuration and start-up -------------------------------------------------------

    def check_url(self, url: str, *, setting: str) -> None:
        """Refuse a URL of this broker's scheme that cannot work, naming ``setting``."""

    def celery_config(self, settings: Any) -> dict[str, Any]:
        """What the broker adds to the pinned Celery configuration."""

    def delivery_timeout(self, settings: Any) -> DeliveryTimeout:
        """The bound on how long a job may be held (the visibility timeout on Redis)."""

    def install(self, app: Any) -> None:
        """Wire the broker's worker plug-ins into ``app`` (bootsteps, control class)."""

    def check_live(self, app: Any) -> None:
        """At finalize: the live configuration still says what the settings say."""

    # -- reading the queues -----------------------------------------------------------------

    def queue_states(self, app: Any, queues: Sequence[str]) -> Mapping[str, QueueState]:
        """Depth and oldest enqueue stamp of each queue, at a cost that does not grow with
        the backlog."""

    def inflight(self, app: Any) -> InflightState | None:
        """Fetched, unacknowledged jobs per queue; ``None`` when the broker cannot tell."""

    def fair_keys(self, app: Any, queues: Sequence[str]) -> list[FairKey]:
        """The fairness keys with jobs waiting on ``queues``, in rotation order (a cost that
        grows with the keys, not the backlog)."""

    def ping(self, url: str, timeout_s: float) -> tuple[bool, str]:
        """Whether the broker answers within ``timeout_s``, and what it said."""

    # -- dispatch -----------------------------------------------------------------------------

    def is_down(self, exc: BaseException) -> bool:
        """Whether ``exc`` (one exception, not its causes) says the broker did not answer."""

    def reach(self, app: Any, channel: Any) -> None:
        """Make sure ``channel`` reaches the broker before a bulk writes anything."""

    def publish_session(self, channel: Any) -> PublishSession:
        """Where a bulk dispatch writes its messages on ``channel``."""

    # -- delays and worker upkeep ----------------------------------------------------------

    def delayed_store(self, app: Any) -> DelayedStore | None:
        """The store of long delays, or ``None`` when the broker delays messages itself."""

    def restore_sweep(self, worker: Any) -> Sweep | None:
        """For a worker without an event loop (gevent): what its timer runs to keep the
        broker's upkeep of held jobs going, or ``None`` when the broker needs none."""
