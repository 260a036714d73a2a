"""Property: any interleaving of claim, crash, lease expiry, retry and replay charges once.

Hypothesis drives deliveries of one charge job (a first delivery, a redelivery after a
crash, a retry, a replay: to the guard they are all just "another delivery") through the
real status CAS on SQLite, with a fake clock and a gateway that honours idempotency keys.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule
from sqlalchemy.pool import StaticPool

from jobs_platform.errors import SkipTransition
from jobs_platform.idempotency import Claim
from tests.unit.idempotency.conftest import SHIP, FakeClock, metadata, orders

LEASE_S = 10.0
KEY = "tests.ship:order_id=1"


@dataclasses.dataclass
class Delivery:
    job: str  # the task id: a retry or redelivery keeps it, a replay or duplicate does not
    owner: str
    #: new | claimed | effected | finished | overtaken | failed | crashed | skipped
    state: str = "new"
    claim: Claim | None = None
    effected: bool = False


class FakeGateway:
    """Honours Idempotency-Key; counts every call (the raw side effects) and every charge."""

    def __init__(self) -> None:
        self.calls = 0
        self.charges: dict[str, str] = {}

    def charge(self, key: str) -> str:
        self.calls += 1
        return self.charges.setdefault(key, f"ch_{len(self.charges) + 1}")


class ChargeMachine(RuleBasedStateMachine):
    deliveries = Bundle("deliveries")

    def __init__(self) -> None:
        super().__init__()
        self.engine = sa.create_engine(
            "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
        )
        metadata.create_all(self.engine)
        with self.engine.begin() as conn:
            conn.execute(sa.insert(orders).values(id=1, status="new"))
        self.clock = FakeClock()
        self.gateway = FakeGateway()
        self.all: list[Delivery] = []
        self.finished = 0

    def teardown(self) -> None:
        self.engine.dispose()

    def expired(self, delivery: Delivery) -> bool:
        assert delivery.claim is not None
        return delivery.claim.expires_at < self.clock()

    def status(self) -> tuple[str, str | None]:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(orders.c.status, orders.c.receipt)).one()
        return row.status, row.receipt

    @rule(target=deliveries)
    def deliver(self) -> Delivery:
        """A new message for the job: a duplicate dispatch or a dead-letter replay."""
        return self._add(f"job{len(self.all)}")

    @rule(target=deliveries, previous=deliveries)
    def retry_same_job(self, previous: Delivery) -> Any:
        """The same message again (a retry, a lost-worker retry, a redelivery).

        Celery does that only once the job's current attempt ended, and so does this rule.
        """
        active = ("new", "claimed", "effected")
        if any(d.job == previous.job and d.state in active for d in self.all):
            return multiple()
        return self._add(previous.job)

    def _add(self, job: str) -> Delivery:
        delivery = Delivery(job=job, owner=f"{job}/attempt{len(self.all)}")
        self.all.append(delivery)
        return delivery

    @rule(delivery=deliveries)
    def claim(self, delivery: Delivery) -> None:
        if delivery.state != "new":
            return
        try:
            delivery.claim = SHIP.claim(
                self.engine,
                1,
                owner=delivery.owner,
                lease_s=LEASE_S,
                now=self.clock(),
                same_job=f"{delivery.job}/",
            )
            delivery.state = "claimed"
        except SkipTransition:
            delivery.state = "skipped"

    @rule(delivery=deliveries)
    def side_effect(self, delivery: Delivery) -> None:
        if delivery.state == "claimed":
            self.gateway.charge(KEY)
            delivery.state, delivery.effected = "effected", True

    @rule(delivery=deliveries)
    def finish(self, delivery: Delivery) -> None:
        if delivery.state == "effected":
            assert delivery.claim is not None
            ok = SHIP.finish(self.engine, delivery.claim, {"receipt": self.gateway.charges[KEY]})
            delivery.state = "finished" if ok else "overtaken"
            self.finished += ok

    @rule(delivery=deliveries)
    def transient_failure_before_side_effect(self, delivery: Delivery) -> None:
        if delivery.state == "claimed":
            assert delivery.claim is not None
            SHIP.release(self.engine, delivery.claim)
            delivery.state = "failed"

    @rule(delivery=deliveries)
    def crash(self, delivery: Delivery) -> None:
        if delivery.state in ("claimed", "effected"):
            delivery.state = "crashed"  # no release, no done: only the lease frees the row

    # Steps around the lease's edges are drawn often; the float range covers the rest.
    @rule(
        seconds=st.one_of(
            st.sampled_from([0.001, LEASE_S / 2, LEASE_S - 0.001, LEASE_S, LEASE_S + 0.001]),
            st.floats(min_value=0, max_value=2.5 * LEASE_S),
        )
    )
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def redelivery_after_the_lease_always_gets_through(self) -> None:
        # A crashed claimant never blocks forever: once leases ran out, a delivery claims
        # the row unless the job is done.
        self.clock.advance(LEASE_S + 1)
        delivery = self.deliver()
        self.claim(delivery)
        done = self.status()[0] == SHIP.done
        assert delivery.state == ("skipped" if done else "claimed")

    @invariant()
    def the_gateway_recorded_at_most_one_charge(self) -> None:
        assert len(self.gateway.charges) <= 1

    @invariant()
    def at_most_one_live_claimant(self) -> None:
        live = [d for d in self.all if d.state in ("claimed", "effected") and not self.expired(d)]
        assert len(live) <= 1
        # ... and nobody else (a stale claimant finishing or releasing) can undo a live claim.
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(orders.c.status, orders.c.claimed_by)).one()
        for delivery in live:
            assert (row.status, row.claimed_by) == (SHIP.to, delivery.owner)

    @invariant()
    def side_effects_repeat_only_after_a_claimant_was_lost_past_its_lease(self) -> None:
        # The documented window: the side effect happened, then the claimant died or overran
        # its lease before writing done. Only then can another delivery repeat the call. A
        # claimant that died is lost at once for a retry of its own job (the same task id
        # takes its claim over: Celery retries a SIGKILLed pool child's job immediately), and
        # for everyone else once its lease ran out.
        lost = sum(
            1
            for d in self.all
            if d.effected
            and (d.state in ("overtaken", "crashed") or (d.state == "effected" and self.expired(d)))
        )
        assert self.gateway.calls <= 1 + lost

    @invariant()
    def done_is_written_once_with_the_one_charge(self) -> None:
        assert self.finished <= 1
        status, receipt = self.status()
        if status == SHIP.done:
            assert self.finished == 1
            assert receipt == self.gateway.charges[KEY]


ChargeMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestChargeMachine = ChargeMachine.TestCase


def test_the_fake_clock_is_timezone_aware() -> None:
    assert FakeClock()().tzinfo is dt.UTC
