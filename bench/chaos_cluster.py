"""The chaos soak on a three-node RabbitMQ cluster: ``python -m bench.chaos --broker
rabbitmq-cluster`` (docs/chaos.md, "On a RabbitMQ cluster").

What differs from the soak on Redis (bench/chaos.py keeps the workload, the fleet, the
ledger and the checks):

- the broker is a :class:`~jobs_platform.testing.rabbitmq_cluster.RabbitCluster` of the
  soak's own (three nodes on loopback, their own names, ports and cookie; the machine's
  RabbitMQ is untouched) with a vhost of its own, and the workers and the producer connect
  with the cluster's ``;``-separated failover list (``JOBS_BROKER_URL``);
- coordination (locks, beat slots, the dead-letter spool, results) is a private
  ``redis-server`` (``JOBS_COORDINATION_URL``);
- the broker fault is :class:`LeaderKill`: SIGKILL of the node that leads the ``fast``
  quorum queue, and its restart ``down_s`` later (instead of the redis-server restart);
- the queues are read over AMQP (ready counts by passive declare) for the producer's
  back-pressure and the drain's "nothing left anywhere";
- :func:`resume_times`: after each leader kill, per worker (one per queue), how long until
  it finished a job again.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import redis

from jobs_platform.testing import RedisServer
from jobs_platform.testing.rabbitmq_cluster import RabbitCluster

#: The queue whose leader's node the soak kills (the busiest: plain work, receipts, beat).
LEADER_QUEUE = "fast"
#: Celery's native delayed-delivery queues (``celery_delayed_0`` .. ``_27``).
DELAYED_QUEUES = tuple(f"celery_delayed_{level}" for level in range(28))
#: The documented bound on the resume time (docs/chaos.md): from the SIGKILL of the leader's
#: node to the first job dispatched after it finished, per worker. Seen here: 0.1-2.3 s when
#: the worker was up at the kill; up to 57 s when it was itself restarting then (docs/chaos.md).
RESUME_BOUND_S = 15.0


class ClusterBroker:
    """The cluster, its vhost and the coordination Redis, started into ``stack``."""

    def __init__(self, stack: contextlib.ExitStack) -> None:
        started = time.monotonic()
        self.cluster = stack.enter_context(RabbitCluster(prefix="jc"))
        self.vhost = f"chaos-{uuid.uuid4().hex[:8]}"
        self.urls = self.cluster.add_vhost(self.vhost)
        stack.callback(self._delete_vhost)
        self.coordination = stack.enter_context(RedisServer())
        self.start_s = time.monotonic() - started

    def _delete_vhost(self) -> None:
        with contextlib.suppress(Exception):  # the cluster is stopped and deleted next anyway
            self.cluster.delete_vhost(self.vhost)

    def env(self) -> dict[str, str]:
        return {
            "JOBS_BROKER_URL": self.urls.failover,
            "JOBS_COORDINATION_URL": self.coordination.url,
        }

    def client(self) -> redis.Redis:
        """The coordination Redis (beat slots, the dead-letter spool)."""
        return redis.Redis.from_url(
            self.coordination.url, socket_timeout=5, socket_connect_timeout=2
        )


def work_queues(app: Any) -> list[str]:
    return [queue.name for queue in app.conf.task_queues or ()]


def backlog(app: Any) -> int:
    """Ready messages in the work queues (raises while no node answers)."""
    from jobs_platform.brokers.rabbitmq.reading import ready_counts

    return sum(ready_counts(app, work_queues(app)).values())


def quiet(app: Any, client: redis.Redis) -> bool:
    """Nothing ready in a work queue, a delayed-delivery level or the dead queue, and nothing
    in the dead-letter spool. Unacknowledged deliveries (running jobs) do not show over AMQP:
    the drain waits longer than a job's hard time limit before it trusts this."""
    from jobs_platform.brokers.rabbitmq.reading import ready_counts
    from jobs_platform.brokers.rabbitmq.topology import DEAD_QUEUE

    queues = [*work_queues(app), *DELAYED_QUEUES, DEAD_QUEUE]
    try:
        if any(ready_counts(app, queues).values()):
            return False
        return not int(client.llen(app.jobs_settings.dlq_spool_key))
    except Exception:  # a node down, the connection refused: not known to be quiet
        return False


# -- the broker fault --------------------------------------------------------------------------


@dataclasses.dataclass
class LeaderKillRecord:
    node: str  #: the node that led ``fast`` and was SIGKILLed
    killed_at: float  #: wall time of the SIGKILL
    new_leader: str | None = None  #: the leader rabbitmqctl showed next
    new_leader_seen_s: float | None = None  #: seconds until rabbitmqctl showed it (coarse)
    restart_s: float | None = None  #: the node's restart until it is a member of fast again
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class LeaderKill(threading.Thread):
    """SIGKILL the node leading :data:`LEADER_QUEUE`, wait ``down_s``, restart it and wait
    until it is an online member of the queue again (in a thread of its own: worker kills go
    on meanwhile, as they would in production)."""

    def __init__(
        self,
        broker: ClusterBroker,
        *,
        down_s: float,
        say: Callable[[str], None],
        on_kill: Callable[[float], None],
    ) -> None:
        super().__init__(daemon=True, name="leader-kill")
        self.broker = broker
        self.down_s = down_s
        self.say = say
        self.on_kill = on_kill
        self.record: LeaderKillRecord | None = None

    def run(self) -> None:
        cluster, vhost = self.broker.cluster, self.broker.vhost
        leader = cluster.leader_of(LEADER_QUEUE, vhost)
        if leader is None:
            self.say(f"no leader of {LEADER_QUEUE!r} to kill (an election under way?)")
            return
        killed_at = time.time()
        cluster.kill(leader)
        self.record = record = LeaderKillRecord(leader, killed_at)
        self.on_kill(killed_at)
        self.say(f"SIGKILL RabbitMQ node {leader.split('@')[0]} (leader of {LEADER_QUEUE!r})")
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(RuntimeError, KeyError):
                    now_leader = cluster.leader_of(LEADER_QUEUE, vhost)
                    if now_leader is not None and now_leader != leader:
                        record.new_leader = now_leader
                        record.new_leader_seen_s = round(time.time() - killed_at, 1)
                        break
                time.sleep(0.2)
            rest = self.down_s - (time.time() - killed_at)
            if rest > 0:
                time.sleep(rest)
            record.restart_s = round(cluster.restart(leader, queue=LEADER_QUEUE, vhost=vhost), 1)
            self.say(
                f"RabbitMQ node {leader.split('@')[0]} back as a member of {LEADER_QUEUE!r} "
                f"after {record.restart_s:g} s (new leader "
                f"{(record.new_leader or '?').split('@')[0]}, seen after "
                f"{record.new_leader_seen_s} s)"
            )
        except Exception as exc:  # reported in the figures; the verdict still runs
            record.error = f"{type(exc).__name__}: {exc}"[:500]
            self.say(f"leader kill: {record.error}")


# -- the resume time ---------------------------------------------------------------------------


def resume_times(
    killed_at: float,
    *,
    sent_at: Mapping[str, float],
    queue_of_job: Mapping[str, str],
    undelayed: Iterable[str],
    runs: Mapping[str, list[dict[str, Any]]],
    ends: Mapping[str, list[float]],
) -> dict[str, dict[str, float | None]]:
    """Per queue (one worker each), seconds from the kill to:

    - ``resumed_s``: the end of the first run of a job the producer first dispatched after
      the kill (an undelayed one): the message went through the cluster after the kill, so
      the worker had consumed again (the producer's own reconnection counts in it, as it
      would for any caller);
    - ``first_run_end_s``: the end of the first run that *started* after the kill (may be a
      message the worker had prefetched before it).
    """
    fresh: dict[str, float] = collections.defaultdict(lambda: float("inf"))
    any_run: dict[str, float] = collections.defaultdict(lambda: float("inf"))
    for task_id in undelayed:
        queue = queue_of_job[task_id]
        if sent_at.get(task_id, 0.0) > killed_at and ends.get(task_id):
            fresh[queue] = min(fresh[queue], min(ends[task_id]))
    for task_id, records in runs.items():
        queue = queue_of_job.get(task_id)
        if queue is None:
            continue
        for record in records:
            started = float(record["ts"])
            if started >= killed_at:
                later = [end for end in ends.get(task_id, []) if end >= started]
                if later:
                    any_run[queue] = min(any_run[queue], min(later))
    out: dict[str, dict[str, float | None]] = {}
    for queue in sorted(set(queue_of_job.values())):
        out[queue] = {
            "resumed_s": _since(killed_at, fresh.get(queue)),
            "first_run_end_s": _since(killed_at, any_run.get(queue)),
        }
    return out


def _since(start: float, at: float | None) -> float | None:
    if at is None or at == float("inf"):
        return None
    return round(at - start, 2)


# -- finding: delayed messages lost at a leader kill ---------------------------------------

#: A delayed message pushed this long before a leader kill may still wait in a delayed-
#: delivery level at the kill (the soak's longest delay is 18 s, retries wait up to 2 s)...
DELAYED_BEFORE_S = 20.0
#: ...or be pushed into the cluster while it elects new leaders (seen: up to ~4 s).
DELAYED_AFTER_S = 10.0


def lost_in_delayed_delivery(
    lost: Iterable[str],
    killed_at: Iterable[float],
    *,
    last_push: Callable[[str], float | None],
    pushed_delayed: Callable[[str], bool],
) -> list[str]:
    """The lost jobs whose last message was a delayed one (a countdown, or a retry's wait,
    both through Celery's native delayed delivery) pushed from ``DELAYED_BEFORE_S`` before
    to ``DELAYED_AFTER_S`` after a leader kill: the loss docs/chaos.md reports (finding 5)."""
    kills = list(killed_at)
    out = []
    for task_id in lost:
        pushed = last_push(task_id)
        if pushed is None or not pushed_delayed(task_id):
            continue
        if any(k - DELAYED_BEFORE_S <= pushed <= k + DELAYED_AFTER_S for k in kills):
            out.append(task_id)
    return sorted(out)
