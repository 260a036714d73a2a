"""The shared limit on the real Redis: spacing, many clients, pauses."""

from __future__ import annotations

import itertools
import threading
import time
import uuid

import pytest
import redis

from jobs_platform.ratelimit import Rate, RateLimiter
from jobs_platform.testing import wait_for

pytestmark = pytest.mark.integration


def test_starts_are_spaced_by_the_rate_across_clients(redis_url: str) -> None:
    key = f"t-{uuid.uuid4().hex[:8]}"
    rate = Rate(20, 1)  # one start per 50 ms
    allowed: list[float] = []
    lock = threading.Lock()

    def client() -> None:
        limiter = RateLimiter(redis.Redis.from_url(redis_url))
        deadline = time.monotonic() + 1.0
        slot = None
        while time.monotonic() < deadline:
            grant = limiter.acquire(key, rate, slot_ms=slot)
            if grant.wait_s == 0:
                slot = None
                with lock:
                    allowed.append(time.monotonic())
            else:
                # At most one slot ahead per client: each holds one reservation at a time.
                assert 0 < grant.wait_s <= 4 * 0.05 + 0.01 and grant.slot_ms is not None
                slot = grant.slot_ms
                time.sleep(grant.wait_s)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # 20/s for 1 s, shared by four clients: never more (one more at the window's edge); a
    # loaded machine may get fewer through, which is not what this test is about.
    assert 10 <= len(allowed) <= 21


def test_a_pause_stops_every_start_and_a_shorter_pause_does_not_shorten_it(
    redis_url: str,
) -> None:
    limiter = RateLimiter(redis.Redis.from_url(redis_url))
    key = f"p-{uuid.uuid4().hex[:8]}"
    assert limiter.acquire(key, None).wait_s == 0
    limiter.pause(key, 2.0)
    limiter.pause(key, 0.5)
    grant = limiter.acquire(key, None)
    assert 1.5 < grant.wait_s <= 2.0 and grant.slot_ms is None  # a pause reserves nothing
    held = limiter.acquire(key, Rate(100, 1))
    assert held.wait_s > 1.5 and held.slot_ms is None


def test_jobs_over_the_limit_reserve_their_own_slots_and_take_them_without_asking_again(
    redis_url: str,
) -> None:
    client = redis.Redis.from_url(redis_url)
    limiter = RateLimiter(client)
    key = f"r-{uuid.uuid4().hex[:8]}"
    rate = Rate(10, 1)  # one start per 100 ms
    grants = [limiter.acquire(key, rate) for _ in range(5)]
    assert grants[0].wait_s == 0 and grants[0].slot_ms is None
    slots = [g.slot_ms or 0 for g in grants[1:]]
    assert all(slots)
    # Each reserved its own slot, one interval after the one before: no two come back at once.
    assert [b - a for a, b in itertools.pairwise(slots)] == [100, 100, 100]
    waits = [g.wait_s for g in grants[1:]]
    assert waits == sorted(waits) and 0 < waits[0] <= 0.1 + 0.01
    # Coming back early: still waiting for its own slot; on time: runs, asking nothing more.
    early = limiter.acquire(key, rate, slot_ms=slots[-1])
    assert early.slot_ms == slots[-1] and early.wait_s > 0

    def due() -> bool:
        seconds, micros = client.time()
        return int(seconds) * 1000 + int(micros) // 1000 >= slots[0]

    wait_for(due, timeout_s=5, interval_s=0.01, message="the first reserved slot")
    tat_before = client.get(f"jobs:rate:{key}:tat")
    assert limiter.acquire(key, rate, slot_ms=slots[0]).wait_s == 0
    assert client.get(f"jobs:rate:{key}:tat") == tat_before  # a reservation took nothing new


def test_a_reservation_that_comes_back_late_asks_again(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    limiter = RateLimiter(client)
    key = f"l-{uuid.uuid4().hex[:8]}"
    rate = Rate(10, 1)
    limiter.acquire(key, rate)
    reserved = limiter.acquire(key, rate).slot_ms
    assert reserved is not None
    # A slot one second past (the worker was busy or down): not started on it, but behind
    # the slots already reserved, so late jobs never start together beyond the rate.
    again = limiter.acquire(key, rate, slot_ms=reserved - 1000)
    assert again.slot_ms == reserved + 100 and again.wait_s > 0
