"""The pure parts of worker leases (jobs_platform/brokers/redis/liveness.py): no broker."""

from __future__ import annotations

import datetime as dt

from jobs_platform import history
from jobs_platform.brokers.redis import liveness

NOW = dt.datetime(2026, 12, 4, 12, 0, tzinfo=dt.UTC)


def test_a_job_that_waited_for_a_future_eta_could_not_have_been_running() -> None:
    assert liveness.may_have_run({"headers": {}}, NOW)  # no ETA: it may have run
    assert liveness.may_have_run({"headers": {"eta": "2026-12-04T11:59:00+00:00"}}, NOW)
    assert not liveness.may_have_run({"headers": {"eta": "2026-12-04T12:30:00+00:00"}}, NOW)
    assert not liveness.may_have_run({"headers": {"eta": "2026-12-04T12:30:00"}}, NOW)  # UTC
    assert liveness.may_have_run({"headers": {"eta": "tomorrow"}}, NOW)  # unreadable: count


def test_owners_and_their_keys() -> None:
    one, two = liveness.new_owner(), liveness.new_owner()
    assert one != two and one.count("/") == 2  # host/pid/nonce
    assert liveness.alive_key("p:", one) == f"p:jobs:worker:alive:{one}"
    assert liveness.held_key("", one) == f"jobs:worker:held:{one}"
    assert liveness.lease_ms(15) == 15_000 and liveness.lease_ms(0) == 1


def test_the_lost_mark_describes_one_delivery_and_is_not_carried_to_the_next_attempt() -> None:
    headers = {history.LOST_WORKER_HEADER: "h/1/x", history.ERRORS_HEADER: []}
    nxt = history.with_error(headers, history.entry("billiard.WorkerLostError", "lost", 1))
    assert history.LOST_WORKER_HEADER not in nxt and len(history.errors_of(nxt)) == 1
    assert liveness.LOST_HEADER == history.LOST_WORKER_HEADER
