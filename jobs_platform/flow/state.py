"""What ``celery -A APP flow`` shows: each key's limit, running and waiting jobs, rate
pauses, circuit breakers and open debounce windows, read from the coordination Redis (no
Celery).

The keys come from two registries the scripts keep (``jobs:flow:conc:keys`` and
``jobs:flow:debounce:windows``), so reading costs a few round trips per key, never a scan
of the keyspace. Entries older than the wait records' life (or whose window closed) are
pruned as they are read.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from jobs_platform.coordination.lease import text
from jobs_platform.flow import breaker, concurrency, debounce
from jobs_platform.ratelimit import pause_key


@dataclasses.dataclass(frozen=True)
class Holder:
    task_id: str
    #: Seconds the slot's lease has left (it is extended while the job runs).
    lease_left_s: float


@dataclasses.dataclass(frozen=True)
class Waiter:
    task_id: str
    #: Seconds since it first asked for a slot.
    waiting_s: float


@dataclasses.dataclass(frozen=True)
class ConcurrencyKey:
    key: str
    limit: int
    running: list[Holder]
    waiting: list[Waiter]


@dataclasses.dataclass(frozen=True)
class Window:
    task: str
    key: str
    run_id: str
    #: Dispatches collapsed into the run so far.
    dispatches: int
    due_in_s: float
    open_for_s: float


@dataclasses.dataclass(frozen=True)
class RateKey:
    key: str
    #: The declared rate(s) of the tasks that name the key ("10/1s"), if any.
    rates: list[str]
    tasks: list[str]
    paused_for_s: float


def _now_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def concurrency_keys(client: Any, *, only: str | None = None) -> list[ConcurrencyKey]:
    """Every key a job asked for within the wait records' life (or just ``only``)."""
    now = _now_ms(client)
    client.zremrangebyscore(concurrency.KEYS_KEY, "-inf", now - concurrency.KEEP_S * 1000)
    names = (
        [only]
        if only is not None
        else [text(k) for k in client.zrange(concurrency.KEYS_KEY, 0, -1)]
    )
    found = []
    for key in names:
        limit = client.hget(concurrency.LIMITS_KEY, key)
        if limit is None:
            continue
        found.append(_concurrency_key(client, key, int(limit), now))
    return found


def _concurrency_key(client: Any, key: str, limit: int, now: int) -> ConcurrencyKey:
    pipe = client.pipeline(transaction=False)
    slots = [f"{concurrency.slot_prefix(key)}{i}" for i in range(1, limit + 1)]
    for slot in slots:
        pipe.get(slot)
        pipe.pttl(slot)
    pipe.zrange(concurrency.waiting_key(key), 0, -1, withscores=True)
    replies = pipe.execute()
    running = [
        Holder(text(owner), max(0, int(ttl)) / 1000.0)
        for owner, ttl in zip(replies[0:-1:2], replies[1:-1:2], strict=True)
        if owner is not None
    ]
    waiting = [Waiter(text(tid), max(0.0, (now - score) / 1000.0)) for tid, score in replies[-1]]
    return ConcurrencyKey(key, limit, running, waiting)


def windows(client: Any, *, only: str | None = None) -> list[Window]:
    """Every open debounce window (of any task; those of key ``only``)."""
    now = _now_ms(client)
    found = []
    for raw in client.zrange(debounce.WINDOWS_KEY, 0, -1):
        task, key = json.loads(text(raw))
        state = client.hgetall(debounce.window_key(task, key))
        if not state:
            client.zrem(debounce.WINDOWS_KEY, raw)  # closed: its run was published
            continue
        if only is not None and key != only:
            continue
        fields = {text(k): text(v) for k, v in state.items()}
        found.append(
            Window(
                task=task,
                key=key,
                run_id=fields["id"],
                dispatches=int(fields.get("count", "1")),
                due_in_s=max(0, int(fields["due"]) - now) / 1000.0,
                open_for_s=max(0, now - int(fields["first"])) / 1000.0,
            )
        )
    return found


def rate_keys(client: Any, declared: dict[str, list[tuple[str, str | None]]]) -> list[RateKey]:
    """``declared``: rate key -> [(task, its rate or None)], from the app's tasks."""
    found = []
    for key in sorted(declared):
        paused = client.pttl(pause_key(key))
        found.append(
            RateKey(
                key=key,
                rates=sorted({rate for _, rate in declared[key] if rate}),
                tasks=sorted(task for task, _ in declared[key]),
                paused_for_s=max(0, int(paused)) / 1000.0,
            )
        )
    return found


def breakers(client: Any, declared: list[str], *, only: str | None = None) -> list[breaker.Reading]:
    """Each breaker the app's tasks declare (``declared``) or a job asked for lately."""
    now = _now_ms(client)
    keys = sorted(set(declared) | set(breaker.known_keys(client)))
    return [breaker.read(client, key, now) for key in keys if only is None or key == only]


def declared_breakers(app: Any) -> list[str]:
    """The downstreams an app's tasks give a circuit breaker (their rate keys)."""
    return sorted(
        {
            task.spec.breaker.key
            for task in app.tasks.values()
            if getattr(task, "spec", None) is not None and task.spec.breaker is not None
        }
    )
