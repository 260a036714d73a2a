"""kombu's Redis queue layout, read at a cost that does not grow with the queue's depth:
the one reader behind the exporter's queue metrics and ``health``'s backlog check.

A queue with priorities is several lists: the queue's name for priority 0 and
``<name><sep><step>`` for each other priority step (kombu's ``Channel._q_for_pri``;
``sep`` is ``"\\x06\\x16"``, the steps ``[0, 3, 6, 9]``, both transport options).
Producers ``LPUSH``, workers ``BRPOP``, so the oldest message of a list is its tail.

- depth: ``LLEN`` of every sub-list (O(1) each), plus the count of keyed messages waiting
  in the queue's fair ring (:mod:`.fair`, one ``GET``);
- oldest waiting: ``LINDEX <list> -1`` of every sub-list (O(1) from the tail), and only
  those few messages are parsed for their ``jobs_enqueued_at`` header;
- in flight: kombu keeps each fetched, unacknowledged message in the ``unacked`` hash
  (tag -> ``[message, exchange, routing key]``) and its fetch time in the ``unacked_index``
  sorted set. ``HLEN`` gives the total; the per-queue split and each queue's oldest read
  the :data:`INFLIGHT_SCAN_LIMIT` oldest entries (``ZRANGE 0 N-1 WITHSCORES`` + ``HMGET``).
  In flight is bounded by the fleet's prefetch (plus jobs held for a countdown), not by the
  backlog; beyond the limit the rest is reported under :data:`UNSCANNED`. Only the app's
  declared queues are counted: an entry of any other routing key (another app's, a
  control reply an old client recorded) makes no series.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from jobs_platform.brokers.interface import InflightState, QueueState
from jobs_platform.brokers.redis import fair
from jobs_platform.clock import unix_time
from jobs_platform.history import ENQUEUED_HEADER
from jobs_platform.routing import QUEUE_NAMES

#: In-flight entries read per scrape for the per-queue split.
INFLIGHT_SCAN_LIMIT = 1000
#: The queue label of in-flight messages beyond :data:`INFLIGHT_SCAN_LIMIT`.
UNSCANNED = "(unscanned)"


@dataclasses.dataclass(frozen=True)
class BrokerLayout:
    """Where kombu keeps one app's queues in Redis."""

    queues: tuple[str, ...] = QUEUE_NAMES
    priority_steps: tuple[int, ...] = (0, 3, 6, 9)
    sep: str = "\x06\x16"
    unacked_key: str = "unacked"
    unacked_index_key: str = "unacked_index"
    #: kombu's ``global_keyprefix`` transport option: before every key it writes.
    prefix: str = ""

    @classmethod
    def from_app(cls, app: Any, queues: Sequence[str] | None = None) -> BrokerLayout:
        """The layout ``app``'s workers use (its transport options), for ``queues``
        (default: the declared ones)."""
        from kombu.transport.redis import PRIORITY_STEPS, Channel

        options = app.conf.broker_transport_options or {}
        declared = tuple(q.name for q in (app.conf.task_queues or ()))
        return cls(
            queues=tuple(queues) if queues is not None else declared or QUEUE_NAMES,
            priority_steps=tuple(options.get("priority_steps", PRIORITY_STEPS)),
            sep=str(options.get("sep", Channel.sep)),
            unacked_key=str(options.get("unacked_key", Channel.unacked_key)),
            unacked_index_key=str(options.get("unacked_index_key", Channel.unacked_index_key)),
            prefix=str(options.get("global_keyprefix") or ""),
        )

    def ring(self, queue: str) -> str:
        """The fair ring of ``queue`` (:mod:`.fair`)."""
        return fair.ring_key(self.prefix + queue, self.sep)

    def sublists(self, queue: str) -> list[str]:
        """Every list of ``queue``, as kombu names them."""
        base = self.prefix + queue
        keys = [f"{base}{self.sep}{step}" if step else base for step in self.priority_steps]
        return list(dict.fromkeys(keys))


def read_queues(client: Any, layout: BrokerLayout) -> dict[str, QueueState]:
    """Depth and oldest enqueue stamp of every queue: one round trip, 2 commands per list
    and one for the fair ring (its keyed messages count in the depth; the oldest stamp is
    the ordinary lists')."""
    pipe = client.pipeline(transaction=False)
    for queue in layout.queues:
        pipe.get(fair.count_key(layout.ring(queue)))
        for key in layout.sublists(queue):
            pipe.llen(key)
            pipe.lindex(key, -1)
    replies = iter(pipe.execute())
    states = {}
    for queue in layout.queues:
        length = max(0, int(next(replies) or 0))
        stamps = []
        for _ in layout.sublists(queue):
            length += int(next(replies))
            stamp = enqueued_at(next(replies))
            if stamp is not None:
                stamps.append(stamp)
        states[queue] = QueueState(length, min(stamps) if stamps else None)
    return states


def enqueued_at(raw: bytes | str | None) -> float | None:
    """Unix time of a raw kombu message's ``jobs_enqueued_at`` header, if it has one."""
    if raw is None:
        return None
    try:
        headers = json.loads(raw).get("headers") or {}
        stamp = headers.get(ENQUEUED_HEADER)
        return unix_time(stamp) if isinstance(stamp, str) else None
    except (ValueError, AttributeError):
        return None  # not a kombu message: nothing to say about its age


def read_inflight(
    client: Any, layout: BrokerLayout, *, limit: int = INFLIGHT_SCAN_LIMIT
) -> InflightState:
    """In-flight count per queue and each queue's oldest fetch time (two round trips)."""
    pipe = client.pipeline(transaction=True)  # the count and the oldest entries agree
    unacked, index = layout.prefix + layout.unacked_key, layout.prefix + layout.unacked_index_key
    pipe.hlen(unacked)
    pipe.zrange(index, 0, limit - 1, withscores=True)
    total, oldest = pipe.execute()
    total = int(total)
    by_queue = {queue: 0 for queue in layout.queues}
    fetched_at: dict[str, float] = {}
    if not oldest:
        return InflightState(total, by_queue, fetched_at)
    values = client.hmget(unacked, [tag for tag, _ in oldest])
    for (_, score), value in zip(oldest, values, strict=True):
        queue = _routing_key(value)
        if queue not in by_queue:
            continue  # acknowledged since the index was read, or not one of the app's queues
        by_queue[queue] += 1
        fetched_at.setdefault(queue, float(score))  # ascending: the first is the oldest
    if total > len(oldest):
        by_queue[UNSCANNED] = total - len(oldest)
    return InflightState(total, by_queue, fetched_at)


def _routing_key(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    try:
        entry = json.loads(value)
    except ValueError:
        return None
    if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[2], str):
        return entry[2]
    return None
