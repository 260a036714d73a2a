"""The tour's partner outage: the shipping partner answers 503 to every call for a few
seconds while orders' shipments keep being booked (``tasks.partner.book_shipment``, a
circuit breaker on ``rate_key="shipping-partner"``).

The breaker opens after its threshold of failures in a row; while it is open the jobs are
deferred (no attempt spent, no dead letter) and only one probe per cool-down reaches the
partner; once the partner is back, one probe closes the breaker and every job runs once.
:func:`run` does it during the tour, aside from the tenant storm and the import (its own
queue, thirdparty), with a line per breaker transition; :func:`settle` reads what it came
to after the drain (so a shipment booked twice would be seen); :func:`report` prints
section 8d and its two expectations.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import Counter
from typing import Any

from rich.table import Table

from jobs_platform import coordination
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.flow import breaker
from jobs_platform.metrics import keys as metric_keys
from jobs_platform.metrics import names as metric_names
from jobs_platform.metrics.counters import encode_field
from jobs_platform.process_local import redis_client
from jobs_platform.testing import wait_for
from tasks.fake_partner import FakePartner, Shipment
from tasks.jobs import app
from tasks.partner import book_shipment

#: Shipments booked during the outage, evenly over ``SPREAD_S`` from its start.
JOBS = {"full": 60, "short": 20}
SPREAD_S = {"full": 2.0, "short": 1.0}
#: How long the partner answers 503 to every call, at least: it stays down until the
#: breaker has opened and its first probe failed (HOLD_S past each), at most MAX_OUTAGE_S.
OUTAGE_S = {"full": 6.0, "short": 3.0}
HOLD_S = 1.0
MAX_OUTAGE_S = 60.0
#: The orders whose shipments the step books (ids of their own: no order of the sale).
FIRST_ORDER = 70_001
#: How often the step reads the breaker (a transition is said at most this late).
POLL_S = 0.05

TITLE = "8d. A partner outage absorbed by the circuit breaker"


@dataclasses.dataclass
class Outage:
    key: str
    threshold: int
    window_s: float
    cooldown_s: float
    #: The jobs' ids, in the order they were dispatched.
    jobs: list[str]
    #: When the step began, when the partner went down and when it came back.
    began: float
    down_at: float
    up_at: float
    spread_s: float
    #: When the step saw the breaker first open (Redis's opened_at) and close again.
    opened_at: float | None = None
    closed_at: float | None = None
    #: Times it opened (the first time, then once per failed probe), from its record.
    opens: int = 0
    #: jobs_breaker_deferred_total{key} when the step began.
    deferred_before: float = 0.0
    ended: float = 0.0
    #: Read by :func:`settle`, after the tour drained every job.
    state: str = "?"
    deferred: float = 0.0
    calls: list[Shipment] = dataclasses.field(default_factory=list)
    dead_letters: int = 0
    states: Counter[str] = dataclasses.field(default_factory=Counter)

    # -- what the partner's records say ---------------------------------------------------

    def failed_before_open(self) -> int:
        """Calls the partner failed before the breaker opened (they opened it)."""
        opened = self.opened_at if self.opened_at is not None else float("inf")
        return sum(1 for c in self.calls if c.status != 200 and c.at <= opened)

    def failed_while_open(self) -> int:
        """Calls that reached the down partner after the breaker opened: probes (and calls
        already under way when it opened)."""
        if self.opened_at is None:
            return 0
        return sum(1 for c in self.calls if c.status != 200 and c.at > self.opened_at)

    def runs(self) -> Counter[str]:
        """Successful calls per job (the partner's Idempotency-Key is the job's id)."""
        return Counter(c.key for c in self.calls if c.status == 200)

    def ran_once(self) -> int:
        runs = self.runs()
        return sum(1 for job in self.jobs if runs.get(job) == 1)


def deferred_total(client: Any, key: str) -> float:
    """jobs_breaker_deferred_total{key} as the workers flushed it (every 2 s)."""
    field = encode_field((metric_names.BREAKER_DEFERRED.name, (key,)))
    value = client.hget(metric_keys.COUNTERS_KEY, field)
    return 0.0 if value is None else float(value)


class Watch:
    """Reads the breaker (every POLL_S while the step runs) and says each transition."""

    def __init__(self, step: Outage, partner: FakePartner, client: Any, view: Any) -> None:
        self.step, self.partner, self.client, self.view = step, partner, client, view
        self.state, self.up = "closed", False

    def hold_down(self, now: float, *, opened: bool) -> None:
        """Keep the partner down until the breaker has opened and one probe has failed.

        On a busy machine the thirdparty worker may reach the partner only seconds after the
        outage began: a fixed-length outage then ended before any call failed, and the step
        showed nothing (seen once under load). Bounded by MAX_OUTAGE_S."""
        step = self.step
        if now >= step.down_at + MAX_OUTAGE_S or self.up:
            return
        if not opened:
            wanted = now + HOLD_S
        else:
            opened_at = step.opened_at or now
            wanted = opened_at + step.cooldown_s + HOLD_S  # the first probe finds it down
        if wanted > step.up_at:
            step.up_at = self.partner.outage(wanted - now)

    def at(self, moment: float) -> str:
        return f"{moment - self.step.down_at:.1f} s into the outage"

    def __call__(self) -> None:
        step, say = self.step, self.view.say
        now = time.time()
        reading = breaker.read(self.client, step.key, int(now * 1000))
        self.hold_down(now, opened=reading.opens > step.opens or step.opened_at is not None)
        if not self.up and now >= step.up_at:
            self.up = True
            say(f"outage: the shipping partner is back ({self.at(step.up_at)})")
        if reading.opens > step.opens:
            if step.opened_at is None:
                step.opened_at = reading.opened_at or now
                failed = sum(1 for c in self.partner.shipments if c.at >= step.down_at)
                say(
                    f"outage: the breaker of {step.key!r} opened {self.at(step.opened_at)}, "
                    f"after {failed} failed call(s): its jobs wait, no attempt spent"
                )
            else:
                say(
                    f"outage: a probe failed ({self.at(now)}): the partner is still down, the "
                    f"breaker open again for {step.cooldown_s:g} s"
                )
            step.opens = reading.opens
        if reading.state == "closed" and self.state != "closed" and step.closed_at is None:
            step.closed_at = now
            say(f"outage: a probe succeeded ({self.at(now)}): the breaker is closed")
        self.state = reading.state


def run(
    workload: str, partner: FakePartner, view: Any, stop: threading.Event | None = None
) -> Outage:
    """Take the partner down, book the shipments, bring it back; wait until every job ended
    (or ``stop`` is set: the tour is failing or interrupted)."""
    stop = stop or threading.Event()
    began = time.time()
    spec = book_shipment.spec.breaker
    assert spec is not None
    client = redis_client(coordination.url_of(app.jobs_settings))
    count, spread = JOBS[workload], SPREAD_S[workload]
    step = Outage(
        spec.key,
        spec.threshold,
        spec.window_s,
        spec.cooldown_s,
        [],
        began,
        down_at=time.time(),
        up_at=0.0,
        spread_s=spread,
        deferred_before=deferred_total(client, spec.key),
    )
    step.up_at = partner.outage(OUTAGE_S[workload])
    view.say(
        f"outage: the shipping partner answers 503 to every call for {OUTAGE_S[workload]:g} s; "
        f"{count} shipments booked over {spread:g} s (book_shipment on thirdparty: "
        f"{spec.threshold} failures in a row open its breaker, {spec.cooldown_s:g} s cool-down)"
    )
    watch = Watch(step, partner, client, view)
    results = []
    for n in range(count):
        if stop.is_set():
            break
        results.append(book_shipment.delay(FIRST_ORDER + n))
        step.jobs.append(results[-1].id)
        deadline = step.down_at + spread * (n + 1) / count
        while time.time() < deadline:
            watch()
            time.sleep(min(POLL_S, max(0.0, deadline - time.time())))
    said = {"done": -1, "at": 0.0}

    def done() -> bool:
        if stop.is_set():
            return True
        watch()
        ready, now = sum(1 for r in results if r.ready()), time.time()
        if ready != said["done"] and (
            ready == count or (step.closed_at is not None and now - said["at"] >= 1.0)
        ):
            said.update(done=ready, at=now)
            view.say(f"outage: {ready}/{count} shipments booked")
        return ready == count and step.closed_at is not None

    with contextlib.suppress(TimeoutError):  # the report says what did not happen
        wait_for(done, timeout_s=120, interval_s=POLL_S)
    step.ended = time.time()
    view.say(f"outage: the step took {step.ended - step.began:.1f} s")
    return step


class Aside:
    """:func:`run` in a thread of its own, beside the tour's other steps."""

    def __init__(self, workload: str, partner: FakePartner, view: Any) -> None:
        self.stop = threading.Event()
        self.result: Outage | None = None
        self.error: BaseException | None = None
        self._args = (workload, partner, view, self.stop)
        self._thread = threading.Thread(target=self._run, name="demo-outage", daemon=True)

    def _run(self) -> None:
        try:
            self.result = run(*self._args)
        except BaseException as exc:  # handed to the main thread by join()
            self.error = exc

    def start(self) -> None:
        self._thread.start()

    @property
    def started(self) -> bool:
        return self._thread.ident is not None

    def join(self, timeout_s: float) -> Outage:
        self._thread.join(timeout_s)
        if self.error is not None:
            raise RuntimeError(f"the partner outage step failed: {self.error!r}") from self.error
        if self.result is None:
            raise TimeoutError(f"the partner outage step did not end within {timeout_s:g} s")
        return self.result


def settle(step: Outage | None, partner: FakePartner) -> None:
    """What the outage came to, after the tour drained every job."""
    if step is None:
        return
    client = redis_client(coordination.url_of(app.jobs_settings))
    reading = breaker.read(client, step.key, int(time.time() * 1000))
    step.state, step.opens = reading.state, max(step.opens, reading.opens)
    step.deferred = deferred_total(client, step.key) - step.deferred_before
    step.calls = [c for c in partner.shipments if c.at >= step.down_at]
    store = DeadLetterStore(app.jobs_settings.database_url)
    rows = store.listing(
        Filter(task=book_shipment.name, since=_utc(step.down_at - 1)), page_size=200
    )
    step.dead_letters = sum(1 for row in rows if row["task_id"] in set(step.jobs))
    step.states = Counter(str(app.AsyncResult(job).state) for job in step.jobs)


def _utc(moment: float) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(moment, tz=dt.UTC)


def report(rep: Any) -> None:
    """Section 8d of the report, with its two expectations."""
    step: Outage | None = rep.facts.outage
    rep.console.print()
    rep.console.rule(f"[bold]{TITLE}")
    if step is None:
        rep.expect(
            "the breaker opened and no job was dead-lettered while the partner was down",
            False,
            "no outage step",
        )
        return
    jobs = len(step.jobs)
    runs = step.runs()
    twice = sum(1 for job in step.jobs if runs.get(job, 0) > 1)
    never = sum(1 for job in step.jobs if not runs.get(job))
    before, during = step.failed_before_open(), step.failed_while_open()
    failed_probes = max(0, step.opens - 1)
    closed = step.state == "closed" and step.closed_at is not None
    outage_s = step.up_at - step.down_at

    def into(moment: float | None) -> str:
        return "never" if moment is None else f"{moment - step.down_at:.1f} s into the outage"

    table = Table(show_header=False)
    table.add_column("what")
    table.add_column("seen")
    table.add_row(
        "the breaker",
        f"[bold]{step.key}[/] ({book_shipment.name}, thirdparty): threshold {step.threshold} "
        f"failures in a row inside {step.window_s:g} s; open {step.cooldown_s:g} s, then a probe",
    )
    table.add_row(
        "the outage",
        f"every call answered 503 for {outage_s:.1f} s; {jobs} shipments booked over its first "
        f"{step.spread_s:g} s",
    )
    table.add_row(
        "it opened",
        f"{into(step.opened_at)}, after [bold]{before}[/] failed call(s) (threshold "
        f"{step.threshold})",
    )
    table.add_row(
        "while open or probing",
        f"[bold]{step.deferred:g}[/] deferrals (jobs_breaker_deferred_total): no attempt "
        f"spent; {during} call(s) reached the partner",
    )
    table.add_row(
        "probes",
        f"{failed_probes} failed (open again for {step.cooldown_s:g} s each); "
        + (
            f"1 succeeded and closed it {into(step.closed_at)}, "
            f"{step.closed_at - step.up_at:.1f} s after the partner came back"
            if closed and step.closed_at is not None
            else f"[red]none closed it (state {step.state})[/]"
        ),
    )
    table.add_row("dead letters from this step", f"[bold]{step.dead_letters}[/]")
    table.add_row(
        "jobs run once",
        f"[bold]{step.ran_once()} of {jobs}[/] (successful calls per Idempotency-Key at the "
        f"partner: {twice} twice, {never} never); results: "
        + ", ".join(f"{n} {state}" for state, n in sorted(step.states.items())),
    )
    table.add_row(
        "calls at the partner",
        f"{len(step.calls)}: {before + during} failed, {sum(runs.values())} succeeded",
    )
    rep.console.print(table)
    rep.console.print(
        "Without the breaker every job would keep calling the down partner, spend its "
        "attempts and land in the dead-letter table. With it, only the calls that opened it "
        "and one probe per cool-down reached the partner; the others were re-published to "
        "come back when a probe may run (same id, same attempt count). In the thirdparty "
        "worker's log: jobs.breaker.opened, jobs.breaker.probe, jobs.breaker.closed "
        "(docs/flow-control.md#circuit-breaker)."
    )
    rep.expect(
        "the breaker opened and no job was dead-lettered while the partner was down",
        step.opened_at is not None and step.dead_letters == 0 and step.deferred > 0,
        f"opened {into(step.opened_at)} after {before} failed calls; {step.deferred:g} "
        f"deferrals; {step.dead_letters} dead letters",
    )
    rep.expect(
        "every job of the outage ran once after the partner came back",
        closed
        and jobs > 0
        and step.ran_once() == jobs
        and step.states.get("SUCCESS", 0) == jobs
        and all(c.at >= step.up_at for c in step.calls if c.status == 200),
        f"{step.ran_once()} of {jobs} ran once ({twice} twice, {never} never); closed by a "
        f"probe: {'yes' if closed else 'no'}",
    )
