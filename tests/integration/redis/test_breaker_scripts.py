"""The circuit breaker's transitions on the real Redis (jobs_platform/flow/breaker.py):
closed -> open after the threshold of failures in a row, deferrals while open, one probe
however many jobs race for it once the cool-down passed, the probe's success closing and
its failure re-opening, a dead probe's claim running out."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis

from jobs_platform.coordination.lease import Leases
from jobs_platform.flow import breaker as b
from jobs_platform.flow.options import Breaker
from jobs_platform.testing import wait_for

pytestmark = pytest.mark.integration


def breakers(redis_url: str) -> b.Breakers:
    client = redis.Redis.from_url(redis_url)
    return b.Breakers(client, Leases(client))


def now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def cooled_down(client: redis.Redis, key: str) -> bool:
    """The cool-down has passed on the Redis clock (the script's own clock)."""
    until = client.hget(b.state_key(key), "until")
    return until is not None and now_ms(client) >= int(until)


def opened(brk: b.Breakers, spec: Breaker) -> None:
    for n in range(spec.threshold):
        brk.failed(spec, f"job-{n}", f"job-{n}:0")


def test_the_threshold_of_failures_in_a_row_opens_it_and_jobs_wait(redis_url: str) -> None:
    brk = breakers(redis_url)
    spec = Breaker(f"partner-{uuid.uuid4().hex[:6]}", threshold=3, window_s=60, cooldown_s=30)
    assert brk.admit(spec, "a", probe_ttl_s=10).run
    assert brk.failed(spec, "a", "a:0") == b.Failure(opened=False, in_a_row=1)
    assert brk.failed(spec, "b", "b:0").in_a_row == 2
    # A success ends the run of failures: counting starts again.
    assert brk.succeeded(spec, "c") is False
    assert brk.failed(spec, "d", "d:0").in_a_row == 1
    assert brk.failed(spec, "e", "e:0").in_a_row == 2
    third = brk.failed(spec, "f", "f:0")
    assert third.opened and third.until_ms is not None
    # Open: a job is deferred until the cool-down ends, never run.
    waiting = brk.admit(spec, "g", probe_ttl_s=10)
    assert not waiting.run and waiting.state == "open"
    assert 25.0 < waiting.wait_s <= 30.0
    # A straggler's failure while open is not counted, and does not move the cool-down.
    assert brk.failed(spec, "h", "h:0") == b.Failure(opened=False, in_a_row=0)
    reading = b.read(brk.client, spec.key, now_ms(brk.client))
    assert reading.state == "open" and reading.value == 1 and reading.opens == 1
    assert reading.threshold == 3 and reading.next_probe_in_s is not None
    assert spec.key in b.known_keys(brk.client)


def test_failures_older_than_the_window_do_not_count(redis_url: str) -> None:
    brk = breakers(redis_url)
    spec = Breaker(f"partner-{uuid.uuid4().hex[:6]}", threshold=2, window_s=0.2, cooldown_s=30)
    brk.failed(spec, "a", "a:0")
    stamp = now_ms(brk.client)
    wait_for(lambda: now_ms(brk.client) > stamp + 300, timeout_s=10, message="the window")
    assert brk.failed(spec, "b", "b:0") == b.Failure(opened=False, in_a_row=1)


def test_racing_jobs_after_the_cool_down_make_exactly_one_probe(redis_url: str) -> None:
    spec = Breaker(f"partner-{uuid.uuid4().hex[:6]}", threshold=2, window_s=60, cooldown_s=0.3)
    brk = breakers(redis_url)
    opened(brk, spec)
    wait_for(lambda: cooled_down(brk.client, spec.key), timeout_s=10, message="the cool-down")
    answers: dict[str, b.Admission] = {}
    start = threading.Barrier(12)

    def race(owner: str) -> None:
        mine = breakers(redis_url)  # a client (a connection) per racer, as workers have
        start.wait()
        answers[owner] = mine.admit(spec, owner, probe_ttl_s=10)

    threads = [threading.Thread(target=race, args=(f"job-{n}",)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    probes = [owner for owner, answer in answers.items() if answer.probe]
    assert len(probes) == 1, answers
    assert all(not a.run and a.state == "half_open" for o, a in answers.items() if o != probes[0])
    assert all(0 < a.wait_s <= 0.3 for o, a in answers.items() if o != probes[0])
    [probe] = probes
    # The probe asking again (deferred by a rate limit meanwhile) is still the probe.
    assert brk.admit(spec, probe, probe_ttl_s=10).probe
    reading = b.read(brk.client, spec.key, now_ms(brk.client))
    assert reading.state == "half_open" and reading.probe == probe and reading.value == 2
    # Only the probe's outcome decides: another job's success changes nothing...
    assert brk.succeeded(spec, "job-other") is False
    # ...the probe's closes it, and every job runs again.
    assert brk.succeeded(spec, probe) is True
    assert brk.admit(spec, "job-later", probe_ttl_s=10).run
    assert b.read(brk.client, spec.key, now_ms(brk.client)).state == "closed"
    assert brk.client.get(b.probe_key(spec.key)) is None


def test_the_probes_failure_reopens_it_for_another_cool_down(redis_url: str) -> None:
    spec = Breaker(f"partner-{uuid.uuid4().hex[:6]}", threshold=1, window_s=60, cooldown_s=0.2)
    brk = breakers(redis_url)
    opened(brk, spec)
    wait_for(lambda: cooled_down(brk.client, spec.key), timeout_s=10, message="the cool-down")
    assert brk.admit(spec, "probe", probe_ttl_s=10).probe
    # A job other than the probe failing while it runs is not the probe's verdict.
    assert not brk.failed(spec, "other", "other:0").opened
    again = brk.failed(spec, "probe", "probe:0")
    assert again.opened
    answer = brk.admit(spec, "next", probe_ttl_s=10)
    assert not answer.run and answer.state == "open"
    reading = b.read(brk.client, spec.key, now_ms(brk.client))
    assert reading.opens == 2 and reading.probe is None


def test_a_dead_probes_claim_runs_out_and_another_job_probes(redis_url: str) -> None:
    spec = Breaker(f"partner-{uuid.uuid4().hex[:6]}", threshold=1, window_s=60, cooldown_s=0.1)
    brk = breakers(redis_url)
    opened(brk, spec)
    wait_for(lambda: cooled_down(brk.client, spec.key), timeout_s=10, message="the cool-down")
    assert brk.admit(spec, "dies", probe_ttl_s=0.3).probe
    assert not brk.admit(spec, "waits", probe_ttl_s=10).run
    found = wait_for(
        lambda: brk.admit(spec, "takes-over", probe_ttl_s=10).probe or None,
        timeout_s=10,
        message="the dead probe's claim to run out",
    )
    assert found
    # A probe that ends saying nothing of the downstream (a permanent error) gives it up.
    brk.release_probe(spec, "takes-over")
    assert brk.admit(spec, "third", probe_ttl_s=10).probe


def test_health_warns_of_an_open_breaker_and_passes_when_closed(redis_url: str) -> None:
    from jobs_platform.health import checks

    spec = Breaker(f"partner-{uuid.uuid4().hex[:6]}", threshold=1, window_s=60, cooldown_s=30)
    brk = breakers(redis_url)
    # (Other tests' breakers on this Redis are listed too: a job asked for their keys.)
    closed = checks.breakers(brk.client, [spec.key])
    assert closed.ok and spec.key not in closed.detail
    opened(brk, spec)
    check = checks.breakers(brk.client, [spec.key])
    assert check.ok and check.warn
    assert f"{spec.key} open (next probe in" in check.detail
