"""The tour's script: a shop's traffic on the running stack, one worker killed, and what
everything came to (:class:`Facts`, which :mod:`.report` judges and prints).

Timeline (seconds from the start of the workload; the short form compresses it):

- from 0: signups (a welcome email now, a reminder in 24 hours each) and uploads (three
  thumbnails each, on ``heavy``); the end-of-day export, due in a few seconds, goes through
  the delayed store;
- a flash sale: every order at once (order intake on ``fast``, its charge through the flaky
  gateway on ``thirdparty``, its stock reservation under the warehouse's 5/s limit), and
  one order whose amount is not a number;
- as soon as a charge is in flight at the gateway, the ``thirdparty`` worker is SIGKILLed
  (main process and pool), restarted, and the jobs it held are redelivered;
- all along, two beats send the stock refresh every second;
- once the tenant storm's statements ended: a CSV import as a batch of chunks, one of them
  dead-lettered by a malformed row, fixed and replayed (:mod:`.csv_import`);
- aside, from the tenant storm on: the shipping partner goes down for a few seconds while
  shipments are booked, and its circuit breaker absorbs the outage (:mod:`.outage`);
- once every job has ended, the beats stop, the reminders are cancelled, the facts are read.

On RabbitMQ (``--broker rabbitmq``) the same timeline runs; what rests on the Redis broker is
read another way, and the report says so: the killed worker's held jobs from the task events
(RabbitMQ requeues them when its connection closes; over AMQP its unacknowledged messages
cannot be listed), the delayed jobs in RabbitMQ's ``celery_delayed_N`` queues (no delayed
store: ``rabbitmqctl list_queues``), the reminders cancelled by ``revoke()`` (one more,
due in seconds, shows a revoked job skipped when it arrives), and the tenant storm without
``fairness_key`` (refused on RabbitMQ).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
import sqlalchemy as sa

from jobs_platform.brokers.rabbitmq import revoke as rabbitmq_revoke
from jobs_platform.brokers.rabbitmq.delays import whole_seconds
from jobs_platform.brokers.redis import liveness
from jobs_platform.brokers.redis.delayed import cancel as delayed_cancel
from jobs_platform.brokers.redis.delayed import get as delayed_get
from jobs_platform.brokers.redis.layout import BrokerLayout
from jobs_platform.brokers.redis.options import keys_for
from jobs_platform.deadletter.alerts import EVENT as ALERT_EVENT
from jobs_platform.deadletter.store import DeadLetterStore, Filter
from jobs_platform.idempotency import unique
from jobs_platform.schedule.slots import SLOT_PREFIX
from jobs_platform.testing import wait_for
from jobs_platform.testing.rabbitmq import rabbitmqctl
from tasks import billing, email, media, reminders, shop
from tasks.demo import checkout, csv_import, fairness, outage
from tasks.demo.broker import Broker
from tasks.demo.live import LiveView
from tasks.demo.observe import EventLog, Sample, Sampler, Track
from tasks.demo.stack import Stack, celery, http_status
from tasks.jobs import app

#: Three thumbnails per upload, the first one big enough to keep a pool process busy.
THUMBNAIL_SIZES = (1200, 600, 150)
UPLOAD_SHAPE = (1800, 1350)
MALFORMED_AMOUNT = "19,90"  # a European decimal comma: not a whole number of cents


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    #: Signups arrive evenly over ``signups_over_s``.
    signups: int
    signups_over_s: float
    #: Uploads arrive as albums (several photos at once), evenly over ``uploads_over_s``.
    uploads: int
    albums: int
    uploads_over_s: float
    #: The flash sale: every order at once, at ``flash_sale_at_s``.
    orders: int
    flash_sale_at_s: float
    export_countdown_s: float
    #: The beats run at least this long after the workload began.
    min_beat_s: float
    #: How long the jobs may take to end once the worker is back.
    drain_timeout_s: float


FULL = Workload(
    "full",
    signups=200,
    signups_over_s=100.0,
    uploads=30,
    albums=5,
    uploads_over_s=100.0,
    orders=80,
    flash_sale_at_s=15.0,
    export_countdown_s=45.0,
    min_beat_s=120.0,
    drain_timeout_s=240.0,
)
SHORT = Workload(
    "short",
    signups=16,
    signups_over_s=8.0,
    uploads=3,
    albums=1,
    uploads_over_s=1.0,
    orders=16,
    flash_sale_at_s=2.0,
    export_countdown_s=8.0,
    min_beat_s=15.0,
    drain_timeout_s=120.0,
)


@dataclasses.dataclass
class Kill:
    worker: str
    pid: int
    at: float
    charges_in_flight: int
    #: The messages the dead worker had fetched and not acknowledged: (task id, task name).
    held: list[tuple[str, str]]
    replacement: str = ""
    back_at: float = 0.0
    restored_at: float = 0.0
    expired_locks: int = 0


@dataclasses.dataclass
class Delayed:
    task_id: str
    countdown_s: float
    time_limit_s: float
    dispatched_at: float
    stored: bool = False
    listing: str = ""
    still_stored_after: bool = False
    reminders: list[str] = dataclasses.field(default_factory=list)
    reminders_stored: int = 0
    cancel_summary: str = ""
    reminders_left: int = 0
    #: On RabbitMQ: a reminder due in seconds, revoked at once (it must arrive and be skipped).
    probe: str = ""
    probe_customer: int = 0
    #: On RabbitMQ: the delayed-delivery level queue the export waits in first.
    first_level: str = ""


@dataclasses.dataclass
class BeatRun:
    beats: dict[int, str]  # pid -> name
    started: float
    stopped: float = 0.0
    #: slot ISO time -> what its record says (the sender's id, or skipped:...)
    records: dict[str, str] = dataclasses.field(default_factory=dict)
    #: (slot ISO time, task id) per run, from the task's own log
    runs: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    #: Beats that did not exit on SIGTERM.
    stuck: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Facts:
    workload: Workload
    t0: float
    broker_url: str
    database_url: str
    demo_dir: Path
    stack: Stack
    orders: dict[int, str] = dataclasses.field(default_factory=dict)  # order id -> amount
    malformed_order: int = 0
    accept_tasks: dict[int, str] = dataclasses.field(default_factory=dict)  # order -> task id
    welcome_tasks: list[str] = dataclasses.field(default_factory=list)
    resize_tasks: list[str] = dataclasses.field(default_factory=list)
    marks: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    kill: Kill | None = None
    delayed: Delayed | None = None
    beat: BeatRun | None = None
    t_end: float = 0.0
    tracks: dict[str, Track] = dataclasses.field(default_factory=dict)
    states: dict[str, str] = dataclasses.field(default_factory=dict)
    accepted: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    reserve_starts: list[float] = dataclasses.field(default_factory=list)
    invoices: dict[int, str] = dataclasses.field(default_factory=dict)  # id -> status
    charges: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    emails: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    answers: Counter[str] = dataclasses.field(default_factory=Counter)
    gateway_requests: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    dead_letters: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    alerts: list[str] = dataclasses.field(default_factory=list)
    samples: list[Sample] = dataclasses.field(default_factory=list)
    baseline: Sample | None = None
    flower_status: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Paid invoices without a receipt -> (the receipt's unique-dispatch lock holder, its
    #: TTL in ms, whether that job was ever sent).
    receipt_locks: dict[int, tuple[str | None, int, bool]] = dataclasses.field(default_factory=dict)
    #: Jobs that had not ended by the deadline -> where their message was then.
    missing: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Which Redis the tour ran on, and what became of it (for the report's words).
    broker: Broker | None = None
    #: The checkout step: an order and its charge in one transaction (tasks/demo/checkout.py).
    checkout: checkout.Checkout | None = None
    #: The tenant storm (tasks/demo/fairness.py).
    fairness: fairness.Storm | None = None
    #: The CSV import as a batch of chunks (tasks/demo/csv_import.py).
    csv_import: csv_import.Import | None = None
    #: The shipping partner's outage and its circuit breaker (tasks/demo/outage.py).
    outage: outage.Outage | None = None

    def mark(self, label: str) -> None:
        self.marks.append((time.time(), label))

    @property
    def on_rabbitmq(self) -> bool:
        return self.broker is not None and self.broker.rabbitmq

    @property
    def redis_url(self) -> str:
        """The tour's Redis: the broker's, or RabbitMQ's coordination Redis."""
        return self.broker.url if self.broker is not None else self.broker_url


# --------------------------------------------------------------------------- preparation


def text(value: Any) -> str:
    """A Redis reply as text (the client returns bytes)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def make_uploads(count: int) -> None:
    """The uploaded images (greyscale PGM), written once and reused by later runs."""
    width, height = UPLOAD_SHAPE
    row = bytes((x * 7) % 256 for x in range(width))
    for upload_id in range(1, count + 1):
        path = media.upload_path(upload_id)
        if path.exists() and path.stat().st_size > width * height:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        shift = upload_id * 13
        pixels = b"".join(row[shift % 256 :] + row[: shift % 256] for _ in range(height))
        path.write_bytes(media.make_pgm(width, height, pixels[: width * height]))


def next_order_id(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        highest = conn.execute(sa.select(sa.func.max(shop.orders.c.id))).scalar()
    return int(highest or 0) + 1


# --------------------------------------------------------------------------- traffic


class Traffic:
    """Dispatches the workload's timeline from one thread, as the shop's web app would."""

    def __init__(self, facts: Facts, view: LiveView, first_order: int) -> None:
        self.facts = facts
        self.view = view
        self.first_order = first_order
        self.export_sent = threading.Event()
        self.sale_sent = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-traffic", daemon=True)

    def timeline(self) -> list[tuple[float, Callable[[], None]]]:
        w = self.facts.workload
        steps: list[tuple[float, Callable[[], None]]] = [(0.5, self.export)]
        steps += [
            (i * w.signups_over_s / w.signups, functools.partial(self.signup, i + 1))
            for i in range(w.signups)
        ]
        per_album = -(-w.uploads // w.albums)
        steps += [
            (
                0.5 + (i // per_album) * w.uploads_over_s / w.albums,
                functools.partial(self.upload, i + 1),
            )
            for i in range(w.uploads)
        ]
        steps.append((w.flash_sale_at_s, self.flash_sale))
        return sorted(steps, key=lambda step: step[0])

    def _run(self) -> None:
        try:
            for offset, action in self.timeline():
                if self._stop.wait(max(0.0, self.facts.t0 + offset - time.time())):
                    return
                action()
        except BaseException as exc:  # handed to the main thread
            self.error = exc

    def signup(self, user_id: int) -> None:
        self.facts.welcome_tasks.append(email.send_welcome_email.delay(user_id).id)
        delayed = self.facts.delayed
        assert delayed is not None
        delayed.reminders.append(reminders.schedule_reminder(user_id))  # in 24 hours

    def upload(self, upload_id: int) -> None:
        for size in THUMBNAIL_SIZES:
            self.facts.resize_tasks.append(media.resize_image.delay(upload_id, size).id)

    def export(self) -> None:
        delayed = self.facts.delayed
        assert delayed is not None
        result = shop.export_orders.apply_async(
            countdown=delayed.countdown_s, time_limit=delayed.time_limit_s
        )
        delayed.task_id, delayed.dispatched_at = result.id, time.time()
        self.export_sent.set()

    def flash_sale(self) -> None:
        facts = self.facts
        count = facts.workload.orders
        facts.mark("flash sale")
        self.view.say(
            f"flash sale: {count} orders placed at once, one with amount {MALFORMED_AMOUNT!r}"
        )
        malformed_at = count // 2
        for n in range(count + 1):
            order_id = self.first_order + n
            amount = MALFORMED_AMOUNT if n == malformed_at else str(500 + (n * 137) % 9000)
            if n == malformed_at:
                facts.malformed_order = order_id
            facts.orders[order_id] = amount
            result = shop.accept_order.delay(order_id, 1000 + n, amount)
            facts.accept_tasks[order_id] = result.id
        self.sale_sent.set()

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:
            self._stop.set()  # Ctrl-C or a failure: dispatch nothing more
        self._thread.join()

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"dispatching the workload failed: {self.error!r}") from self.error


# --------------------------------------------------------------------------- the kill


def held_messages(
    client: redis.Redis, layout: BrokerLayout, queue: str
) -> dict[str, tuple[str, str]]:
    """Messages of ``queue`` fetched by a worker and not acknowledged: tag -> (id, task)."""
    held = {}
    for tag, raw in client.hgetall(layout.unacked_key).items():
        payload, _exchange, routing_key = json.loads(raw)
        if routing_key == queue:
            headers = payload.get("headers") or {}
            held[text(tag)] = (str(headers.get("id")), str(headers.get("task")))
    return held


def held_by_dead(client: redis.Redis, pid: int) -> int:
    """How many jobs the killed worker's connections still hold (their lease not yet run
    out, or not yet claimed by a live worker's upkeep)."""
    pattern = f"*{liveness.KEY_PREFIX}held:*/{pid}/*"
    return sum(int(client.scard(key)) for key in client.scan_iter(match=pattern, count=1000))


def expire_unique_locks(client: redis.Redis) -> int:
    """Expire the unique-dispatch locks of the killed worker's jobs, as their ``unique_for``
    (300 s at most here) would; how many there were."""
    expired = 0
    for key in client.scan_iter(match=f"{unique.LOCK_PREFIX}*", count=1000):
        ttl_ms = int(client.pttl(key))
        if 0 <= ttl_ms < app.jobs_settings.visibility_timeout * 1000:
            expired += int(client.delete(key))
    return expired


def held_by_events(events: EventLog, hostname: str, at: float) -> list[tuple[str, str]]:
    """On RabbitMQ: jobs ``hostname`` had received and not ended (nor retried since) at
    ``at``, as the task events tell it (its unacknowledged deliveries cannot be listed
    over AMQP, and RabbitMQ requeues them as soon as its connection closes)."""
    held = []
    for task_id, track in events.snapshot().items():
        got = [t for t, h in zip(track.received, track.hostnames, strict=False) if h == hostname]
        got = [t for t in got if t <= at]
        if not got:
            continue
        last = max(got)
        if any(t is not None and t <= at for t in (track.succeeded, track.failed)):
            continue
        if any(last <= t <= at for t, _ in track.retried):
            continue
        held.append((task_id, track.name))
    return held


def kill_and_recover(
    facts: Facts, view: LiveView, client: redis.Redis, traffic: Traffic, events: EventLog
) -> None:
    if facts.on_rabbitmq:
        kill_and_recover_rabbitmq(facts, view, client, traffic, events)
        return
    stack = facts.stack

    def charge_in_flight() -> bool:
        traffic.check()
        return stack.gateway.in_flight > 0

    with contextlib.suppress(TimeoutError):  # all charged already: kill it anyway
        wait_for(charge_in_flight, timeout_s=30, interval_s=0.002)
    victim = stack.workers["thirdparty"]
    assert victim.process is not None
    in_flight = stack.gateway.in_flight
    pid = victim.process.pid
    victim.kill()  # SIGKILL to the main process and its pool: no ack, no goodbye
    facts.mark("SIGKILL thirdparty")
    held = held_messages(client, BrokerLayout.from_app(app), "thirdparty")
    kill = facts.kill = Kill(victim.hostname, pid, time.time(), in_flight, list(held.values()))
    names = Counter(name.rsplit(".", 1)[-1] for _, name in held.values())
    view.say(
        f"[bold red]SIGKILL[/] worker {victim.hostname} (pid {pid}) with {in_flight} charge(s) "
        f"in flight at the gateway; the broker holds its {len(held)} unacknowledged "
        f"message(s) ({', '.join(f'{n} {k}' for k, n in names.items())}): acks are late, "
        "nothing is lost"
    )
    replacement = stack.worker("thirdparty")
    stack.workers["thirdparty"] = replacement
    replacement.start(wait=False)
    replacement.wait_ready(180)
    kill.replacement, kill.back_at = replacement.hostname, time.time()
    facts.mark("worker restarted")
    view.say(f"worker restarted as {replacement.hostname} after {kill.back_at - kill.at:.1f} s")
    # The held messages come back by themselves once the dead worker's lease has run out
    # (JOBS_WORKER_LEASE, 15 s): a live worker's upkeep claims them. The unique-dispatch
    # locks of the killed jobs live unique_for (300 s): the tour does not wait for those.
    kill.expired_locks = expire_unique_locks(client)
    wait_for(
        lambda: (traffic.check(), held_by_dead(client, pid) == 0)[1],
        timeout_s=app.jobs_settings.worker_lease + 60,
        interval_s=0.2,
        message="the killed worker's held jobs to be claimed",
    )
    kill.restored_at = time.time()
    view.say(
        f"the {len(held)} held message(s) were back on their queue "
        f"{kill.restored_at - kill.at:.1f} s after the kill (the dead worker's lease ran out)"
    )


def kill_and_recover_rabbitmq(
    facts: Facts, view: LiveView, client: redis.Redis, traffic: Traffic, events: EventLog
) -> None:
    """The kill on RabbitMQ: its deliveries go back to the queue when its connection
    closes; the tour waits for a live worker to receive each of them again."""
    stack = facts.stack

    def charge_in_flight() -> bool:
        traffic.check()
        return stack.gateway.in_flight > 0

    with contextlib.suppress(TimeoutError):  # all charged already: kill it anyway
        wait_for(charge_in_flight, timeout_s=30, interval_s=0.002)
    victim = stack.workers["thirdparty"]
    assert victim.process is not None
    in_flight = stack.gateway.in_flight
    pid = victim.process.pid
    victim.kill()
    at = time.time()
    facts.mark("SIGKILL thirdparty")
    kill = facts.kill = Kill(victim.hostname, pid, at, in_flight, [])
    view.say(
        f"[bold red]SIGKILL[/] worker {victim.hostname} (pid {pid}) with {in_flight} charge(s) "
        "in flight at the gateway; RabbitMQ requeues its unacknowledged deliveries when its "
        "connection closes: acks are late, nothing is lost"
    )
    replacement = stack.worker("thirdparty")
    stack.workers["thirdparty"] = replacement
    replacement.start(wait=False)
    replacement.wait_ready(180)
    kill.replacement, kill.back_at = replacement.hostname, time.time()
    facts.mark("worker restarted")
    view.say(f"worker restarted as {replacement.hostname} after {kill.back_at - at:.1f} s")
    # Its events were published before it died; read once the restart has given them time.
    kill.held = held_by_events(events, victim.hostname, at)
    kill.expired_locks = expire_unique_locks(client)

    def redelivered() -> bool:
        traffic.check()
        for task_id, _ in kill.held:
            track = events.get(task_id)
            again = any(t > at for t in track.received) or track.final is not None
            if not again:
                return False
        return True

    wait_for(
        redelivered,
        timeout_s=120,
        interval_s=0.2,
        message="the killed worker's jobs to reach a live worker again",
    )
    kill.restored_at = time.time()
    names = Counter(name.rsplit(".", 1)[-1] for _, name in kill.held)
    view.say(
        f"the {len(kill.held)} job(s) it held ({', '.join(f'{n} {k}' for k, n in names.items())}) "
        f"reached a live worker again {kill.restored_at - at:.1f} s after the kill"
    )


# --------------------------------------------------------------------------- delayed jobs


def delayed_queues(facts: Facts) -> dict[str, int]:
    """On RabbitMQ: the messages waiting in each non-empty ``celery_delayed_N`` queue of the
    tour's vhost (``rabbitmqctl list_queues``: AMQP cannot count what the vhost holds)."""
    assert facts.broker is not None
    rows = rabbitmqctl(
        "list_queues", "-p", facts.broker.vhost, "--no-table-headers", "name", "messages"
    )
    found = {}
    for line in rows.splitlines():
        name, _, count = line.partition("\t")
        if name.startswith("celery_delayed_") and count.strip().isdigit() and int(count):
            found[name] = int(count)
    return dict(sorted(found.items(), key=lambda item: -int(item[0].rsplit("_", 1)[-1])))


def first_level(countdown_s: float) -> str:
    """The delayed-delivery queue a wait of ``countdown_s`` starts in: its highest bit's."""
    return f"celery_delayed_{int(math.log2(whole_seconds(countdown_s)))}"


def show_delayed_rabbitmq(facts: Facts, view: LiveView, traffic: Traffic) -> None:
    delayed = facts.delayed
    assert delayed is not None
    traffic.export_sent.wait(30)
    traffic.check()
    delayed.first_level = first_level(delayed.countdown_s)
    # One reminder due in seconds, revoked at once: when it arrives it must be skipped.
    delayed.probe_customer = 10**6 + int(time.time()) % 10**6
    delayed.probe = reminders.schedule_reminder(delayed.probe_customer, delay_s=3)
    app.control.revoke(delayed.probe)
    # Quorum queues' counts in rabbitmqctl lag by up to its stats interval (5 s): whether
    # the export waited in the broker is judged by when a worker got it (at its due time).
    queues = delayed_queues(facts)
    listing = subprocess.run(
        celery("delayed", "list", "--task", shop.export_orders.name),
        env={**facts.stack.env, "COLUMNS": "150"},
        cwd=facts.demo_dir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    refusal = (listing.stdout + listing.stderr).strip().splitlines()
    delayed.listing = "\n".join(
        [
            *(f"{name}\t{count}" for name, count in queues.items()),
            "",
            f"$ celery -A tasks delayed list  (exit {listing.returncode})",
            *(refusal[-1:] if refusal else []),
        ]
    )
    view.say(
        f"the end-of-day export waits in RabbitMQ's {delayed.first_level} (due in "
        f"{delayed.countdown_s:g} s); no delayed store: `celery -A tasks delayed list` says so"
    )


def show_delayed(facts: Facts, view: LiveView, client: redis.Redis, traffic: Traffic) -> None:
    if facts.on_rabbitmq:
        show_delayed_rabbitmq(facts, view, traffic)
        return
    delayed = facts.delayed
    assert delayed is not None
    traffic.export_sent.wait(30)
    traffic.check()
    delayed.stored = delayed_get(client, keys_for(app), delayed.task_id) is not None
    listing = subprocess.run(
        celery("delayed", "list", "--task", shop.export_orders.name),
        env={**facts.stack.env, "COLUMNS": "150"},
        cwd=facts.demo_dir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    delayed.listing = (listing.stdout + listing.stderr).strip()
    view.say(
        f"the end-of-day export waits in the delayed store (due in {delayed.countdown_s:g} s), "
        "`celery -A tasks delayed list` shows it"
    )


def cancel_reminders_rabbitmq(facts: Facts, view: LiveView, client: redis.Redis) -> None:
    """On RabbitMQ: the reminders wait in the broker's delayed queues, where nothing can
    take them out; ``revoke()`` records their ids on the coordination Redis, and a worker
    skips each one when it arrives (jobs_platform.brokers.rabbitmq.revoke)."""
    delayed = facts.delayed
    assert delayed is not None
    # 24 hours start in the level of their highest bit (2^16 s); nothing else waits there.
    level = first_level(reminders.REMINDER_DELAY_S)
    delayed.reminders_stored = delayed_queues(facts).get(level, 0)
    app.control.revoke(delayed.reminders)
    recorded = sum(
        bool(client.exists(rabbitmq_revoke.key_of(task_id))) for task_id in delayed.reminders
    )
    delayed.reminders_left = len(delayed.reminders) - recorded
    keep_h = rabbitmq_revoke.keep_s(app.jobs_settings) / 3600
    delayed.cancel_summary = (
        f"app.control.revoke() of {len(delayed.reminders)} id(s): {recorded} recorded on the "
        f"coordination Redis ({rabbitmq_revoke.KEY_PREFIX}<id>, kept {keep_h:.1f} h)"
    )
    view.say(f"revoked the 24-hour reminders: {delayed.cancel_summary}")


def cancel_reminders(facts: Facts, view: LiveView, client: redis.Redis) -> None:
    if facts.on_rabbitmq:
        cancel_reminders_rabbitmq(facts, view, client)
        return
    delayed = facts.delayed
    assert delayed is not None
    keys = keys_for(app)
    delayed.reminders_stored = sum(
        delayed_get(client, keys, task_id) is not None for task_id in delayed.reminders
    )
    done = subprocess.run(
        celery(
            "delayed",
            "cancel",
            *delayed.reminders,
            "--reason",
            "the demo is over",
            "--actor",
            "make demo",
        ),
        env=facts.stack.env,
        cwd=facts.demo_dir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = (done.stdout + done.stderr).strip().splitlines()
    delayed.cancel_summary = lines[-1] if lines else f"exit {done.returncode}"
    delayed.reminders_left = sum(
        delayed_get(client, keys, task_id) is not None for task_id in delayed.reminders
    )
    view.say(f"cancelled the 24-hour reminders: {delayed.cancel_summary}")


def forget_delayed(facts: Facts) -> None:
    """On the way out, whatever happened: take this run's jobs out of the delayed store, so
    an interrupted tour leaves no reminder to be sent tomorrow by whichever worker runs then."""
    delayed = facts.delayed
    if delayed is None or facts.on_rabbitmq:  # RabbitMQ: the vhost goes, with its queues
        return
    client = redis.Redis.from_url(facts.broker_url)
    keys = keys_for(app)
    with contextlib.suppress(redis.RedisError):
        for task_id in [*delayed.reminders, delayed.task_id]:
            if task_id:
                delayed_cancel(client, keys, task_id)


# --------------------------------------------------------------------------- waiting


def pending_jobs(facts: Facts, events: EventLog) -> list[str]:
    """Jobs sent since the workload began that have not ended (the reminders excepted)."""
    skip = set(facts.delayed.reminders if facts.delayed else ())
    if facts.delayed is not None and facts.delayed.probe:
        skip.add(facts.delayed.probe)  # revoked: skipped, no end event
    return [
        task_id
        for task_id, track in events.snapshot().items()
        if track.sent and track.sent[0] >= facts.t0 and track.final is None and task_id not in skip
    ]


#: A job that ended leaves the broker; one that has been nowhere in it for this long, with no
#: end, will not end: waiting longer for it only delays the report.
GONE_FOR_S = 15.0


def wait_until_done(
    facts: Facts, view: LiveView, events: EventLog, client: redis.Redis, timeout_s: float
) -> bool:
    """Wait for every job to end; False (and the report says which did not) at the deadline,
    or as soon as every job still open has been gone from the broker for GONE_FOR_S."""
    gone_since: dict[str, float] = {}

    def done() -> bool:
        view.tick()
        pending = pending_jobs(facts, events)
        if not pending:
            return True
        if len(pending) > 20:  # still flowing; looking each one up would cost more than it tells
            return False
        now = time.time()
        for task_id in pending:
            if not facts.on_rabbitmq and whereabouts(client, task_id) == NOWHERE:
                gone_since.setdefault(task_id, now)
            else:
                gone_since.pop(task_id, None)
        return all(t in gone_since and now - gone_since[t] >= GONE_FOR_S for t in pending)

    with contextlib.suppress(TimeoutError):
        wait_for(done, timeout_s=timeout_s, interval_s=1.0)
    pending = pending_jobs(facts, events)
    if pending:
        names = Counter(events.get(t).name for t in pending)
        view.say(f"[bold red]some jobs have not ended:[/] {dict(names)}")
    for task_id in pending:
        facts.missing[task_id] = UNSEARCHABLE if facts.on_rabbitmq else whereabouts(client, task_id)
    return not pending


NOWHERE = "nowhere in the broker"
UNSEARCHABLE = "not known: RabbitMQ's queues cannot be searched over AMQP"


def whereabouts(client: redis.Redis, task_id: str) -> str:
    """Where a message of ``task_id`` still is in the broker, if anywhere."""
    layout = BrokerLayout.from_app(app)
    needle = task_id.encode()
    for queue in layout.queues:
        for key in layout.sublists(queue):
            if any(needle in item for item in client.lrange(key, 0, -1)):
                return f"waiting in {queue}"
    if any(needle in item for item in client.hvals(layout.unacked_key)):
        return "fetched by a worker, not acknowledged"
    if delayed_get(client, keys_for(app), task_id) is not None:
        return "in the delayed store"
    return NOWHERE


def stop_beats(facts: Facts, view: LiveView, client: redis.Redis) -> None:
    beat = facts.beat
    assert beat is not None
    for service in facts.stack.beats:
        service.terminate()  # both at once: no hand-over to the other one on the way out
    beat.stopped = time.time()
    for service in facts.stack.beats:
        service.stop(timeout_s=10)
        if service.stuck:
            view.say(f"[red]{service.name} did not exit within 10 s of SIGTERM: SIGKILLed[/]")
    beat.stuck = [s.name for s in facts.stack.beats if s.stuck]
    facts.mark("beats stopped")
    prefix = f"{SLOT_PREFIX}{shop.STOCK_SYNC_ENTRY}:"
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        slot = text(key)[len(prefix) :]
        value = client.get(key)
        if value is not None:
            beat.records[slot] = text(value)
    view.say(f"beats stopped after {beat.stopped - beat.started:.0f} s")


def read_sync_runs(facts: Facts) -> None:
    beat = facts.beat
    assert beat is not None
    log = shop.sync_runs_log()
    lines = log.read_text().splitlines() if log.exists() else []
    beat.runs = [tuple(line.split(" ", 1)) for line in lines if " " in line]  # type: ignore[misc]


# --------------------------------------------------------------------------- facts


def gather(facts: Facts, events: EventLog, sampler: Sampler) -> None:
    """Read what everything came to: events, results, the database, the gateway."""
    facts.tracks = {t: k for t, k in events.snapshot().items() if k.sent and k.sent[0] >= facts.t0}
    for task_id, track in facts.tracks.items():
        facts.states[task_id] = track.final or str(app.AsyncResult(task_id).state)
    for order_id, task_id in facts.accept_tasks.items():
        result = app.AsyncResult(task_id)
        if result.state == "SUCCESS":
            facts.accepted[order_id] = dict(result.result)
    for accepted in facts.accepted.values():
        started = app.AsyncResult(accepted["reserve_task"]).result
        if isinstance(started, float):
            facts.reserve_starts.append(started)
    engine = billing.billing_engine()
    invoice_ids = [a["invoice_id"] for a in facts.accepted.values()]
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(billing.invoices.c.id, billing.invoices.c.status).where(
                billing.invoices.c.id.in_(invoice_ids)
            )
        ).all()
    facts.invoices = {int(i): str(s) for i, s in rows}
    gateway = facts.stack.gateway
    facts.charges, facts.emails = list(gateway.charges), list(gateway.emails)
    facts.answers = Counter(gateway.answers)
    facts.gateway_requests = list(gateway.requests)
    receipt_locks(facts)
    store = DeadLetterStore(facts.database_url)
    since = Filter(since=_utc(facts.t0 - 5))
    facts.dead_letters = store.listing(since, page_size=200)
    facts.alerts = [
        line
        for path in sorted(facts.stack.log_dir.glob("*@demo.log"))
        for line in path.read_text(errors="replace").splitlines()
        if ALERT_EVENT in line
        and any(row["task_id"] and row["task_id"] in line for row in facts.dead_letters)
    ]
    facts.samples, facts.baseline = list(sampler.samples), sampler.baseline
    export = facts.tracks.get(facts.delayed.task_id) if facts.delayed else None
    if export is not None and export.received:
        facts.marks.append((min(export.received), "export released"))
    facts.t_end = time.time()


def receipt_locks(facts: Facts) -> None:
    """For a paid invoice with no receipt: who holds its receipt's unique-dispatch lock."""
    sent = {int(e["subject"].rsplit(" ", 1)[-1]) for e in facts.emails if "invoice" in e["subject"]}
    client = redis.Redis.from_url(facts.redis_url)
    for invoice_id, status in facts.invoices.items():
        if status != "paid" or invoice_id in sent:
            continue
        identity = unique.identity_of(billing.send_invoice_email, [invoice_id], {})
        holder = client.get(unique.LOCK_PREFIX + identity)
        holder_id = None if holder is None else text(holder)
        facts.receipt_locks[invoice_id] = (
            holder_id,
            int(client.pttl(unique.LOCK_PREFIX + identity)),
            holder_id in facts.tracks,
        )


def _utc(moment: float) -> Any:
    import datetime as dt

    return dt.datetime.fromtimestamp(moment, tz=dt.UTC)


def check_flower(facts: Facts) -> None:
    stack = facts.stack
    facts.flower_status = {
        "without a password": http_status(f"{stack.flower_url}/"),
        "with the demo credentials": http_status(f"{stack.flower_url}/", auth=stack.flower_auth),
    }


# --------------------------------------------------------------------------- the tour


def run(facts: Facts, view: LiveView, events: EventLog, sampler: Sampler) -> None:
    """Run the workload on the started stack and fill ``facts``."""
    w = facts.workload
    client = redis.Redis.from_url(facts.redis_url)
    stack = facts.stack
    facts.beat = BeatRun(
        beats={b.pid: b.name for b in stack.beats}, started=min(b.started_at for b in stack.beats)
    )
    facts.delayed = Delayed(
        task_id="",
        countdown_s=w.export_countdown_s,
        # The longest hard limit the default visibility timeout allows: with it, any wait
        # of a second or more crosses the divert threshold, as a 24-hour countdown does.
        time_limit_s=app.jobs_settings.visibility_timeout - app.jobs_settings.visibility_margin - 1,
        dispatched_at=0.0,
    )
    first_order = next_order_id(billing.billing_engine())
    view.phase = f"{w.name} tour: the shop is open"
    # The partner's outage runs aside on thirdparty, from the worker's recovery on, while
    # the checkout, the tenant storm and the import run: its cool-downs cost no time.
    down = outage.Aside(w.name, stack.partner, view)
    try:
        _shop_is_open(facts, view, events, client, first_order, down)
        _after_the_sale(facts, view, events, client, down)
    finally:
        down.stop.set()  # nothing left to do for it, or the tour failed: it stops waiting


def _shop_is_open(
    facts: Facts,
    view: LiveView,
    events: EventLog,
    client: redis.Redis,
    first_order: int,
    down: outage.Aside,
) -> None:
    w = facts.workload
    with Traffic(facts, view, first_order) as traffic, ThreadPoolExecutor(1) as aside:
        # The CLI takes seconds to start: run it aside, so the kill is not late.
        looked = aside.submit(show_delayed, facts, view, client, traffic)
        check_flower(facts)
        traffic.sale_sent.wait(w.flash_sale_at_s + 60)
        traffic.check()
        view.phase = f"{w.name} tour: flash sale"
        kill_and_recover(facts, view, client, traffic, events)
        facts.mark("partner outage")
        down.start()
        looked.result(timeout=120)
        facts.checkout = checkout.run(facts, view)
        view.phase = f"{w.name} tour: draining"
    traffic.check()


def _after_the_sale(
    facts: Facts, view: LiveView, events: EventLog, client: redis.Redis, down: outage.Aside
) -> None:
    w = facts.workload
    stack = facts.stack
    view.phase = f"{w.name} tour: a tenant storm"
    facts.fairness = fairness.storm(w.name, view.say)
    view.phase = f"{w.name} tour: a CSV import as a batch"
    facts.mark("CSV import")
    facts.csv_import = csv_import.run(w.name, view)
    view.phase = f"{w.name} tour: a partner outage"
    facts.outage = down.join(timeout_s=300)
    view.phase = f"{w.name} tour: draining"
    wait_until_done(facts, view, events, client, w.drain_timeout_s)
    delayed = facts.delayed
    if facts.on_rabbitmq:  # it waited in RabbitMQ if no worker got it before it was due
        export = events.get(delayed.task_id)
        due = delayed.dispatched_at + delayed.countdown_s
        delayed.stored = bool(export.received) and min(export.received) >= due - 0.5
        delayed.still_stored_after = not export.received
    else:
        delayed.still_stored_after = delayed_get(client, keys_for(app), delayed.task_id) is not None
    # The beats keep going until they have run long enough to count on.

    def beats_ran_long_enough() -> bool:
        view.tick()
        return time.time() >= facts.t0 + w.min_beat_s

    wait_for(beats_ran_long_enough, timeout_s=w.min_beat_s + 5, interval_s=0.2)
    view.phase = f"{w.name} tour: stopping the beats"
    stop_beats(facts, view, client)
    wait_until_done(facts, view, events, client, 60)
    read_sync_runs(facts)
    checkout.settle(facts)
    csv_import.settle(facts.csv_import)
    outage.settle(facts.outage, stack.partner)
    cancel_reminders(facts, view, client)
    time.sleep(1.0)  # the last events and counter flushes (every 2 s) are informational
    view.phase = f"{w.name} tour: done"
