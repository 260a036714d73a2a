"""The lease primitive on a real Redis, and JOBS_COORDINATION_URL: what the fleet agrees on
lives on the coordination Redis, not on the broker's, when the two differ."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform import ConfigError, ReliableTask, coordination, create_app
from jobs_platform.coordination.lease import Leases
from jobs_platform.idempotency.unique import LOCK_PREFIX
from jobs_platform.ratelimit import KEY_PREFIX as RATE_PREFIX
from jobs_platform.schedule.scheduler import Scheduler
from jobs_platform.testing import RedisServer


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(redis_url)
    yield made
    made.close()


@pytest.fixture()
def leases(client: redis.Redis) -> Leases:
    return Leases(client)


def key() -> str:
    return f"jptest:lease:{uuid.uuid4().hex}"


def test_acquire_takes_a_free_lease_and_names_the_holder_otherwise(leases: Leases) -> None:
    k = key()
    assert leases.acquire(k, "a", 5) == ("a", True)
    assert leases.acquire(k, "b", 5) == ("a", False)
    assert leases.holder(k) == "a"
    assert 4000 < leases.client.pttl(k) <= 5000


def test_only_the_owner_releases_extends_or_replaces(leases: Leases, client: redis.Redis) -> None:
    k = key()
    leases.acquire(k, "a", 5)
    assert not leases.release(k, "b") and not leases.extend(k, "b", 60)
    assert not leases.replace(k, "b", "x")
    assert leases.extend(k, "a", 60) and client.pttl(k) > 50_000
    assert leases.replace(k, "a", "skipped:a") and client.pttl(k) > 50_000  # TTL kept
    assert leases.holder(k) == "skipped:a"
    assert not leases.release(k, "a")  # replaced: "a" no longer holds it
    k2 = key()
    leases.acquire(k2, "a", 5)
    assert leases.release(k2, "a") and leases.holder(k2) is None


def test_hold_extends_ours_takes_a_free_one_and_leaves_anothers(leases: Leases) -> None:
    k = key()
    assert leases.hold(k, "a", 5) == 2  # taken
    assert leases.hold(k, "a", 5) == 1  # extended
    assert leases.hold(k, "b", 5) == 0  # someone else's
    assert leases.holder(k) == "a"


def test_companions_live_and_die_with_the_lease(leases: Leases, client: redis.Redis) -> None:
    k, side = key(), key()
    assert leases.acquire(k, "a", 5, companions={side: "entry-1"}) == ("a", True)
    assert client.get(side) == b"entry-1" and client.pttl(side) > 4000
    leases.acquire(k, "b", 5, companions={key(): "never"})  # not taken: no companion written
    assert leases.extend(k, "a", 60, companions=[side]) and client.pttl(side) > 50_000
    assert leases.release(k, "a", companions=[side])
    assert client.get(side) is None and client.get(k) is None


def test_racing_acquirers_get_one_holder(leases: Leases) -> None:
    k = key()
    won: list[str] = []
    barrier = threading.Barrier(16)

    def race(owner: str) -> None:
        barrier.wait()
        holder, acquired = leases.acquire(k, owner, 5)
        if acquired:
            won.append(holder)

    threads = [threading.Thread(target=race, args=(f"o{n}",)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and leases.holder(k) == won[0]


def test_a_pipeline_runs_many_acquires_in_order(leases: Leases, client: redis.Redis) -> None:
    k = key()
    pipe = client.pipeline(transaction=False)
    for owner in ("a", "b", "c"):
        leases.acquire_on(pipe, k, owner, 5)
    from jobs_platform.coordination.lease import read_acquired

    assert [read_acquired(reply) for reply in pipe.execute()] == [
        ("a", True),
        ("a", False),
        ("a", False),
    ]


def test_an_expired_lease_is_free_again(leases: Leases) -> None:
    k = key()
    leases.acquire(k, "a", 0.05)
    deadline = time.monotonic() + 5
    while leases.holder(k) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert leases.acquire(k, "b", 5) == ("b", True)


# -- JOBS_COORDINATION_URL -----------------------------------------------------------------


def test_a_coordination_url_that_is_not_redis_is_refused() -> None:
    with pytest.raises(ConfigError, match="JOBS_COORDINATION_URL='amqp://h//': the scheme"):
        create_app("coord", broker_url="redis://127.0.0.1:6399/0", coordination_url="amqp://h//")
    with pytest.raises(ConfigError, match=r"JOBS_COORDINATION_URL='redis://h/x'.*database number"):
        create_app("coord", broker_url="redis://127.0.0.1:6399/0", coordination_url="redis://h/x")


def test_locks_limits_and_beat_use_the_coordination_redis(redis_url: str) -> None:
    with RedisServer() as other:
        app = create_app("coord", broker_url=redis_url, coordination_url=other.url)
        assert coordination.url_of(app.jobs_settings) == other.url

        @app.task(
            base=ReliableTask,
            bind=True,
            name=f"coord.job.{uuid.uuid4().hex[:6]}",
            queue="fast",
            business_key=("n",),
            unique_for=60,
            rate_limit="5/s",
        )
        def job(self: Any, n: int) -> None: ...

        result = job.delay(7)
        broker, coord = redis.Redis.from_url(redis_url), redis.Redis.from_url(other.url)
        try:
            lock = f"{LOCK_PREFIX}{job.name}:n=7"
            assert coord.get(lock) == result.id.encode()
            assert broker.get(lock) is None
            from jobs_platform.ratelimit import limiter_for

            grant = limiter_for(coordination.url_of(app.jobs_settings)).acquire(
                job.spec.rate_key, job.spec.rate
            )
            assert grant.wait_s == pytest.approx(0.0)
            assert coord.keys(f"{RATE_PREFIX}*") and not broker.keys(f"{RATE_PREFIX}*")
            scheduler = Scheduler(app=app, sender_id="coord-test")
            assert scheduler.redis.connection_pool.connection_kwargs["port"] == other.port
        finally:
            app.control.purge()
            broker.close()
            coord.close()
