"""The tour's report: what happened, read from the tour's :class:`~.tour.Facts`, and the
expectations that make ``make demo`` exit 1 when one does not hold.

Sections: jobs by outcome per queue; retries and their waits; dead letters; charges vs
orders; the checkout; the killed worker; the delayed job; beat slots vs sends; the rate
limit; the tenant storm; the CSV import; the partner outage; the expectations; where to look next.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
import re
from collections import Counter, defaultdict

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from jobs_platform.deadletter.alerts import EVENT as ALERT_EVENT
from jobs_platform.idempotency import unique
from jobs_platform.ratelimit import parse_rate
from jobs_platform.retry.backoff import backoff_window
from jobs_platform.schedule.slots import SKIPPED_MARK, parse_slot
from tasks import billing, shop
from tasks.demo import checkout, csv_import, fairness, outage
from tasks.demo.observe import QUEUES, Track
from tasks.demo.tour import NOWHERE, Facts
from tasks.jobs import app
from tasks.paths import absolute_database_url, data_dir

#: Shown per section at most; the rest is summed up.
MAX_ROWS = 12
OK, FAILED = "[green]✓[/]", "[bold red]✗[/]"


@dataclasses.dataclass(frozen=True)
class Check:
    what: str
    ok: bool
    detail: str


def short(task_id: str) -> str:
    return task_id[:8]


def hhmmss(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, tz=dt.UTC).strftime("%H:%M:%S")


def section(console: Console, title: str) -> None:
    console.print()
    console.rule(f"[bold]{title}")


class Report:
    def __init__(self, console: Console, facts: Facts) -> None:
        self.console = console
        self.facts = facts
        self.checks: list[Check] = []
        self.held = {task_id for task_id, _ in (facts.kill.held if facts.kill else [])}
        self.reminders = set(facts.delayed.reminders if facts.delayed else ())
        if facts.delayed is not None and facts.delayed.probe:
            self.reminders.add(facts.delayed.probe)
        # Jobs of this run, the 24-hour reminders aside (they are cancelled, not run).
        self.jobs = {t: k for t, k in facts.tracks.items() if t not in self.reminders}
        # The import's poison chunk dies on purpose: section 8c judges it, the others leave
        # it aside.
        self.import_deaths = facts.csv_import.expected_deaths() if facts.csv_import else set()

    def header(self) -> None:
        """Which broker the tour ran on, and what of the tour rests on the Redis broker."""
        facts = self.facts
        broker = facts.broker
        name = broker.name if broker is not None else "Redis"
        self.console.print()
        self.console.rule(f"[bold]Report: the {facts.workload.name} tour on {name}")
        if broker is not None:
            self.console.print(f"broker: {broker.describe()}")
        if facts.on_rabbitmq:
            self.console.print(
                "Redis-only features, shown as RabbitMQ does them: no delayed store (delays "
                "wait in RabbitMQ's celery_delayed_N queues, reminders are cancelled by "
                "revoke(): 6); no fair queues (fairness_key is refused: 8b); no priorities "
                "(quorum queues serve one level; the tour uses none). The killed worker's "
                "held jobs are read from the task events (5)."
            )

    def expect(self, what: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(what, ok, detail))
        return ok

    # ------------------------------------------------------------------ 1. outcomes

    def outcomes(self) -> None:
        section(self.console, "1. Jobs by outcome, per queue")
        rows: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
        for task_id, track in self.jobs.items():
            row = rows[(track.queue or "?", track.name or "?")]
            state = self.facts.states.get(task_id, "?")
            row["jobs"] += 1
            row[state] += 1
            row["retries"] += len(track.retried)
            row["redelivered"] += task_id in self.held
        table = Table(show_lines=False)
        for name in (
            "queue",
            "task",
            "jobs",
            "succeeded",
            "failed",
            "not ended",
            "retries",
            "redelivered",
        ):
            table.add_column(name, justify="left" if name in ("queue", "task") else "right")
        order = {q: n for n, q in enumerate(QUEUES)}
        for (queue, name), row in sorted(
            rows.items(), key=lambda r: (order.get(r[0][0], 9), r[0][1])
        ):
            open_ = row["jobs"] - row["SUCCESS"] - row["FAILURE"]
            table.add_row(
                queue,
                name,
                str(row["jobs"]),
                str(row["SUCCESS"]),
                f"[red]{row['FAILURE']}[/]" if row["FAILURE"] else "0",
                f"[bold red]{open_}[/]" if open_ else "0",
                str(row["retries"]),
                str(row["redelivered"]),
            )
        self.console.print(table)
        self.console.print(self.exporter_line())
        not_ended = [t for t in self.jobs if self.facts.states.get(t) not in ("SUCCESS", "FAILURE")]
        for task_id in not_ended:
            track = self.jobs[task_id]
            where = self.facts.missing.get(task_id, "?")
            self.console.print(
                f"[red]{track.name}[{task_id}] did not end[/]: sent "
                f"{len(track.sent)}x, received {len(track.received)}x "
                f"({', '.join(track.hostnames) or 'by no worker'}), started "
                f"{len(track.started)}x; its message is {where}"
            )
            if where == NOWHERE and not track.received and not self.facts.on_rabbitmq:
                self.console.print(
                    "  No worker announced it and the broker no longer has it: it was taken off "
                    "its queue and never recorded as fetched. kombu's Redis transport pops a "
                    "message (BRPOP) and writes it to the unacked set only once the worker has "
                    "read the reply; a worker SIGKILLed in between loses it, late acks or not."
                )
        self.expect(
            "no job lost: every job sent ended",
            not not_ended,
            f"{len(self.jobs)} jobs, {len(not_ended)} not ended"
            + (f" ({', '.join(short(t) for t in not_ended[:5])})" if not_ended else ""),
        )
        failed = {t for t in self.jobs if self.facts.states.get(t) == "FAILURE"}
        malformed = self.facts.accept_tasks.get(self.facts.malformed_order)
        others = failed - self.import_deaths
        self.expect(
            "only the malformed order failed",
            others == {malformed},
            f"failed: {sorted(self.jobs[t].name + ' ' + short(t) for t in others) or 'none'}"
            + (" (and the import's poison chunk, 8c)" if failed & self.import_deaths else ""),
        )

    def exporter_line(self) -> str:
        facts = self.facts
        last = next((s for s in reversed(facts.samples) if s.ok), None)
        if last is None or facts.baseline is None:
            return "[red]the metrics exporter gave no sample[/]"
        parts = []
        for queue in QUEUES:
            done = last.succeeded.get(queue, 0) - facts.baseline.succeeded.get(queue, 0)
            failed = last.failed.get(queue, 0) - facts.baseline.failed.get(queue, 0)
            retried = last.retried.get(queue, 0) - facts.baseline.retried.get(queue, 0)
            parts.append(f"{queue} {done:g} succeeded / {failed:g} failed / {retried:g} retried")
        return (
            "[dim]The exporter's counters over the same run (celery_task_*_total): "
            + "; ".join(parts)
            + ". They count attempts in the worker processes; the killed worker's last flush "
            "(up to 2 s of counts) died with it.[/]"
        )

    # ------------------------------------------------------------------ 2. retries

    def retries(self) -> None:
        section(self.console, "2. Retries and their waits")
        retried = [(t, k) for t, k in self.jobs.items() if k.retried]
        table = Table()
        for name in (
            "task",
            "job",
            "attempts",
            "why it was retried",
            "waits (s)",
            "backoff windows (s)",
        ):
            table.add_column(name)
        too_short: list[str] = []
        for task_id, track in sorted(retried, key=lambda r: -len(r[1].retried))[:MAX_ROWS]:
            waits, windows = self.waits(task_id, track)
            table.add_row(
                track.name.rsplit(".", 1)[-1],
                short(task_id),
                str(len(track.started)),
                "; ".join(sorted({cause(why) for _, why in track.retried}))[:80],
                ", ".join(f"{w:.2f}" for w in waits) or "-",
                ", ".join(f"{lo:g}-{hi:g}" for lo, hi in windows) or "-",
            )
        for task_id, track in retried:
            waits, windows = self.waits(task_id, track)
            if any(w < lo - 0.05 for w, (lo, _) in zip(waits, windows, strict=False)):
                too_short.append(short(task_id))
        if retried:
            self.console.print(table)
        total = sum(len(k.retried) for _, k in retried)
        self.console.print(
            f"{total} retries of {len(retried)} jobs (the gateway's 503s and lost replies, the "
            "shipping partner's outage of 8d), "
            "each back through the broker after an equal-jitter wait: half to all of a window "
            "that doubles (2 s, 4 s, ... by default). A wait here is from one attempt's start to "
            "the next one's, so it includes the attempt itself."
        )
        self.expect(
            "every retry waited at least half its backoff window",
            not too_short and bool(retried),
            f"{total} retries" + (f"; too soon: {too_short}" if too_short else ""),
        )

    def waits(self, task_id: str, track: Track) -> tuple[list[float], list[tuple[float, float]]]:
        """Waits between attempts and the policy's window for each, for a job that was only
        retried (a redelivered or rate-deferred job also has other restarts)."""
        if task_id in self.held or len(track.started) != len(track.retried) + 1:
            return [], []
        task = app.tasks.get(track.name)
        policy = getattr(task, "retry_policy", None)
        waits = [b - a for a, b in itertools.pairwise(sorted(track.started))]
        if policy is None:
            return waits, []
        windows = []
        for number in range(1, len(waits) + 1):
            hi = backoff_window(number, policy.backoff_s, policy.backoff_max_s)
            windows.append((hi / 2 if policy.jitter else hi, hi))
        return waits, windows

    # ------------------------------------------------------------------ 3. dead letters

    def dead_letters(self) -> None:
        facts = self.facts
        section(self.console, "3. Dead letters (from the dead_letter_jobs table)")
        table = Table()
        for name in ("id", "task", "queue", "reason", "attempts", "error", "args"):
            table.add_column(name, overflow="fold")
        for row in facts.dead_letters[:MAX_ROWS]:
            table.add_row(
                str(row["id"]),
                row["task_name"],
                row["queue"],
                row["reason"],
                str(row["attempts"]),
                f"{row['error_type'].rsplit('.', 1)[-1]}: {row['error_message']}",
                str(row["args"]),
            )
        self.console.print(table)
        self.console.print(
            f"{len(facts.alerts)} alert line(s) in the worker logs (event {ALERT_EVENT}, one "
            "per dead letter). A permanent error (here ValueError, and the import's "
            "MalformedRow) is not retried: the row was written at the first attempt."
        )
        malformed = facts.accept_tasks.get(facts.malformed_order)
        rows = [r for r in facts.dead_letters if r["task_id"] == malformed]
        others = [r for r in facts.dead_letters if r["task_id"] not in self.import_deaths]
        poison = len(facts.dead_letters) - len(others)
        self.expect(
            "the malformed order is one dead letter, reason permanent",
            len(others) == 1 and len(rows) == 1 and rows[0]["reason"] == "permanent",
            f"{len(others)} dead letter(s) this run"
            + (f" (+{poison} of the import's poison chunk, 8c)" if poison else "")
            + "; the order's: "
            + (f"#{rows[0]['id']} {rows[0]['reason']}" if rows else "missing"),
        )

    # ------------------------------------------------------------------ 4. charges

    def charges(self) -> None:
        facts = self.facts
        section(self.console, "4. Charges vs orders (the payment gateway's own records)")
        invoice_ids = {a["invoice_id"] for a in facts.accepted.values()}
        refs = Counter(
            c["reference"] for c in facts.charges if _invoice_of(c["reference"]) in invoice_ids
        )
        receipts = Counter(
            int(e["subject"].rsplit(" ", 1)[-1])
            for e in facts.emails
            if e.get("subject", "").startswith("Receipt for invoice ")
        )
        receipts = Counter({i: n for i, n in receipts.items() if i in invoice_ids})
        paid = sum(1 for i in invoice_ids if facts.invoices.get(i) == "paid")
        valid = len(facts.orders) - 1
        twice = sorted(r for r, n in refs.items() if n > 1)
        answers = facts.answers
        table = Table(show_header=False)
        table.add_column("what")
        table.add_column("count", justify="right")
        table.add_row("orders placed (one malformed)", str(len(facts.orders)))
        table.add_row("orders accepted, each with its invoice", str(len(facts.accepted)))
        table.add_row("invoices paid", str(paid))
        table.add_row(
            "charge requests at the gateway",
            str(sum(answers.values())),
        )
        table.add_row("  charged", str(answers["charged"]))
        table.add_row("  503 busy, nothing charged (retried)", str(answers["busy"]))
        table.add_row("  charged, then the reply was lost (502, retried)", str(answers["lost"]))
        table.add_row(
            "  same Idempotency-Key again: the first charge returned", str(answers["replayed"])
        )
        table.add_row(
            "[bold]charges the gateway recorded for these invoices[/]",
            f"[bold]{sum(refs.values())}[/]",
        )
        table.add_row("invoices charged more than once", f"[bold]{len(twice)}[/]")
        table.add_row("receipts sent (the mailer dedupes nothing)", str(sum(receipts.values())))
        self.console.print(table)
        self.console.print(
            "Each charge runs under a status compare-and-swap on its invoice (open -> charging "
            "-> paid) and sends the job's stable Idempotency-Key, so a retry after a lost "
            "reply, or a job redelivered after its worker died mid-charge, gets the first "
            "charge back instead of charging again."
        )
        self.expect(
            "every valid order charged exactly once (gateway's count)",
            sum(refs.values()) == valid == len(invoice_ids) == paid and not twice,
            f"{valid} valid orders, {len(invoice_ids)} invoices, {paid} paid, "
            f"{sum(refs.values())} charges, {len(twice)} charged twice",
        )
        for invoice, (holder, ttl_ms, was_sent) in sorted(facts.receipt_locks.items()):
            self.console.print(
                f"[red]invoice {invoice} is paid and has no receipt[/]: its receipt's "
                f"unique-dispatch lock is held by {holder or 'nobody'} for {ttl_ms / 1000:.0f} s "
                f"more, a job that was {'sent' if was_sent else '[bold]never sent[/]'}"
            )
        self.expect(
            "one receipt per paid invoice",
            sum(receipts.values()) == paid and all(n == 1 for n in receipts.values()),
            f"{sum(receipts.values())} receipts for {paid} paid invoices",
        )

    # ------------------------------------------------------------------ 5. the kill

    def kill(self) -> None:
        facts = self.facts
        kill = facts.kill
        section(self.console, "5. A worker SIGKILLed mid-run")
        if kill is None:
            self.expect("the killed worker's jobs were redelivered", False, "no kill happened")
            return
        if facts.on_rabbitmq:
            self.console.print(
                f"{hhmmss(kill.at)} SIGKILL to {kill.worker} (pid {kill.pid}, its whole process "
                f"group) with {kill.charges_in_flight} charge(s) in flight at the gateway. The "
                f"task events say it held {len(kill.held)} job(s) received and not ended "
                "(over AMQP a consumer's unacknowledged deliveries cannot be listed). With late "
                "acks they were still RabbitMQ's: it requeued them when the dead worker's "
                f"connection closed, no lease to run out. {kill.replacement} was ready "
                f"{kill.back_at - kill.at:.1f} s later; every held job had reached a live "
                f"worker again {kill.restored_at - kill.at:.1f} s after the kill. The tour "
                f"expired the {kill.expired_locks} unique-dispatch lock(s) of the killed jobs "
                "(coordination Redis), which would otherwise last their unique_for (300 s)."
            )
        else:
            self.kill_text_redis()
        self.kill_table()

    def kill_text_redis(self) -> None:
        kill = self.facts.kill
        assert kill is not None
        self.console.print(
            f"{hhmmss(kill.at)} SIGKILL to {kill.worker} (pid {kill.pid}, its whole process "
            f"group) with {kill.charges_in_flight} charge(s) in flight at the gateway. It had "
            f"{len(kill.held)} message(s) fetched and not acknowledged: with late acks they "
            f"stay in the broker's unacked set. {kill.replacement} was ready "
            f"{kill.back_at - kill.at:.1f} s later. The held messages were back on their "
            f"queue {kill.restored_at - kill.at:.1f} s after the kill, by themselves: the "
            "dead worker's lease (JOBS_WORKER_LEASE, 15 s) ran out and a live worker put its "
            "jobs back (the visibility timeout, 1 h, is only the backstop). The tour expired "
            f"the {kill.expired_locks} unique-dispatch lock(s) of the killed jobs, which "
            "would otherwise last their unique_for (300 s)."
        )

    def kill_table(self) -> None:
        facts = self.facts
        kill = facts.kill
        assert kill is not None
        invoice_of = {
            a["charge_task"]: a["invoice_id"] for a in facts.accepted.values() if "charge_task" in a
        }
        table = Table()
        for name in ("job", "task", "starts", "outcome", "what happened"):
            table.add_column(name)
        # One row per job: a job retried or deferred just before the kill has two messages
        # held, the attempt that was running and its next one, already fetched.
        jobs = list(dict.fromkeys(kill.held))
        for task_id, name in jobs[:MAX_ROWS]:
            track = facts.tracks.get(task_id, Track())
            before = any(t < kill.at for t in track.started)
            note = "fetched, not started: ran after the restart"
            if task_id in invoice_of:
                note = self.charge_note(invoice_of[task_id], before)
            elif name == shop.reserve_stock.name:
                note = (
                    "waiting for its turn under the rate limit (every deferral is a start), "
                    "held by the worker: ran after the restart"
                )
            elif before:
                note = "running when killed: ran again"
            table.add_row(
                short(task_id),
                name.rsplit(".", 1)[-1],
                str(len(track.started)),
                facts.states.get(task_id, "?"),
                note,
            )
        self.console.print(table)
        unfinished = [t for t, _ in jobs if facts.states.get(t) != "SUCCESS"]
        messages = f" ({len(kill.held)} messages)" if len(kill.held) != len(jobs) else ""
        self.expect(
            "the killed worker's jobs were redelivered and finished",
            bool(jobs) and not unfinished,
            f"{len(jobs)} held{messages}, {len(unfinished)} not finished",
        )

    def charge_note(self, invoice: int, started_before_kill: bool) -> str:
        facts = self.facts
        charged = sum(c["reference"] == f"invoice-{invoice}" for c in facts.charges)
        key = unique.business_identity(billing.charge_invoice.name, {"invoice_id": invoice})
        replayed = any(r["key"] == key and r["status"] == 200 for r in facts.gateway_requests)
        if started_before_kill and replayed:
            return (
                f"invoice {invoice}: charged before the kill; the redelivered run got that "
                f"charge back (same Idempotency-Key): {charged} charge"
            )
        if started_before_kill:
            return f"invoice {invoice}: charging when killed, ran again: {charged} charge"
        return (
            f"invoice {invoice}: fetched, not started; charged after the restart: {charged} charge"
        )

    # ------------------------------------------------------------------ 6. delayed

    def delayed(self) -> None:
        if self.facts.on_rabbitmq:
            self.delayed_rabbitmq()
            return
        facts = self.facts
        delayed = facts.delayed
        section(self.console, "6. A delayed job through the delayed store")
        if delayed is None or not delayed.task_id:
            self.expect("the delayed export ran once", False, "it was never sent")
            return
        track = facts.tracks.get(delayed.task_id, Track())
        due = delayed.dispatched_at + delayed.countdown_s
        released = min(track.received) if track.received else None
        self.console.print(
            f"The end-of-day export was sent at {hhmmss(delayed.dispatched_at)} with "
            f"countdown={delayed.countdown_s:g} s and a {delayed.time_limit_s:g} s hard limit. "
            "A job waits in the store when wait + hard limit >= the visibility timeout minus "
            f"its margin ({delayed.time_limit_s + 1:g} s by default): a 24-hour countdown always "
            "does; with its limit, so did this one. Stored: "
            + ("yes" if delayed.stored else "[red]no[/]")
            + ". While it waited:"
        )
        self.console.print(
            Panel(
                delayed.listing or "(no output)",
                title="celery -A tasks delayed list --task tasks.shop.export_orders",
                expand=False,
            )
        )
        late = f"{released - due:+.2f} s from its due time" if released else "never"
        self.console.print(
            f"Released onto heavy at {hhmmss(released) if released else '-'} ({late}; a "
            "worker's releaser runs every 0.25 s), received "
            f"{len(track.received)} time(s), run {len(track.started)} time(s): "
            f"{facts.states.get(delayed.task_id, '?')}. "
            f"The {len(delayed.reminders)} 24-hour reminders (one per signup) waited there too "
            f"({delayed.reminders_stored} stored) and were cancelled at the end: "
            f"{delayed.cancel_summary}."
        )
        self.expect(
            "the delayed export went through the store and ran exactly once",
            delayed.stored
            and not delayed.still_stored_after
            and len(track.started) == 1
            and facts.states.get(delayed.task_id) == "SUCCESS"
            and released is not None
            and released >= due - 0.5,
            f"stored {delayed.stored}, runs {len(track.started)}, {late}",
        )
        self.expect(
            "the 24-hour reminders waited in the store, and were cancelled",
            delayed.reminders_stored == len(delayed.reminders) and delayed.reminders_left == 0,
            f"{delayed.reminders_stored} of {len(delayed.reminders)} stored, "
            f"{delayed.reminders_left} left after cancelling",
        )

    def delayed_rabbitmq(self) -> None:
        facts = self.facts
        delayed = facts.delayed
        section(
            self.console,
            "6. A delayed job through RabbitMQ's delayed-delivery queues (no delayed store)",
        )
        if delayed is None or not delayed.task_id:
            self.expect("the delayed export ran once", False, "it was never sent")
            return
        track = facts.tracks.get(delayed.task_id, Track())
        due = delayed.dispatched_at + delayed.countdown_s
        released = min(track.received) if track.received else None
        self.console.print(
            f"The end-of-day export was sent at {hhmmss(delayed.dispatched_at)} with "
            f"countdown={delayed.countdown_s:g} s. On RabbitMQ the delayed store is a Redis "
            "feature: a delay waits in the broker itself (Celery's native delayed delivery), "
            "in the queues celery_delayed_27 .. _0, 2^N seconds in queue N for each bit of "
            "the whole seconds it waits (rounded up). This one started in "
            f"{delayed.first_level}; it was there: "
            + ("yes" if delayed.stored else "[red]no[/]")
            + " (no worker received it before it was due). While it waited (`rabbitmqctl "
            "list_queues -p VHOST name messages`, non-empty delayed queues; the reminders' 24 "
            "hours start in celery_delayed_16; quorum queues' counts there lag up to 5 s):"
        )
        self.console.print(
            Panel(
                delayed.listing or "(no output)",
                title="the tour's vhost: delayed-delivery queues",
                expand=False,
            )
        )
        late = f"{released - due:+.2f} s from its due time" if released else "never"
        self.console.print(
            f"Delivered to heavy at {hhmmss(released) if released else '-'} ({late}), "
            f"received {len(track.received)} time(s), run {len(track.started)} time(s): "
            f"{facts.states.get(delayed.task_id, '?')}."
        )
        self.expect(
            "the delayed export waited in RabbitMQ (no worker got it before it was due) and "
            "ran exactly once",
            delayed.stored
            and not delayed.still_stored_after
            and len(track.started) == 1
            and facts.states.get(delayed.task_id) == "SUCCESS"
            and released is not None
            and released >= due - 0.5,
            f"waited in RabbitMQ {delayed.stored}, runs {len(track.started)}, {late}",
        )
        probe = facts.tracks.get(delayed.probe, Track())
        probe_state = facts.states.get(delayed.probe, "?")
        written = (data_dir() / "outbox" / f"reminder-{delayed.probe_customer}.eml").exists()
        self.console.print(
            f"The {len(delayed.reminders)} 24-hour reminders (one per signup) wait in those "
            f"queues too ({delayed.reminders_stored} message(s) in celery_delayed_16), where "
            "nothing can take one out: they were cancelled by revoke(), which records each id "
            "on the coordination Redis so that a worker, even one started tomorrow, skips the "
            f"job when it arrives: {delayed.cancel_summary}. To show that skip, one more "
            "reminder, due in 3 s, was revoked as soon as it was sent: when it arrived the "
            "worker discarded it (Celery sends no task-received event for a revoked job, and "
            f"stores REVOKED): started {len(probe.started)} time(s), state {probe_state}, its "
            f"reminder {'[red]written[/]' if written else 'not written'}."
        )
        self.expect(
            "the 24-hour reminders waited in RabbitMQ, and were revoked",
            delayed.reminders_stored >= len(delayed.reminders) and delayed.reminders_left == 0,
            f"{delayed.reminders_stored} in celery_delayed_16 for {len(delayed.reminders)} "
            f"reminders, {delayed.reminders_left} not recorded revoked",
        )
        self.expect(
            "a reminder revoked while it waited was skipped when it arrived",
            not probe.started and probe_state == "REVOKED" and not written,
            f"started {len(probe.started)}x, {probe_state}, reminder "
            + ("written" if written else "not written"),
        )

    # ------------------------------------------------------------------ 7. beat

    def beat(self) -> None:
        facts = self.facts
        beat = facts.beat
        section(self.console, "7. Beat: two beats, a 1-second entry, each slot sent once")
        if beat is None:
            self.expect("each beat slot sent and run once", False, "no beat ran")
            return
        runs_per_slot = Counter(slot for slot, _ in beat.runs)
        sent = {
            s: v
            for s, v in beat.records.items()
            if not v.startswith(SKIPPED_MARK)
            and beat.started - 2 <= parse_slot(s).timestamp() <= beat.stopped + 1
        }
        by_beat = Counter(beat.beats.get(_pid_of(v), "another beat") for v in sent.values())
        slots = sorted(parse_slot(s).timestamp() for s in sent)
        span = round(slots[-1] - slots[0]) + 1 if slots else 0
        missing = span - len(slots)
        twice = sorted(s for s, n in runs_per_slot.items() if n > 1)
        recorded = {s for s, v in beat.records.items() if not v.startswith(SKIPPED_MARK)}
        unsent_runs = sorted(set(runs_per_slot) - recorded)
        sent_counter = 0.0
        last = next((s for s in reversed(facts.samples) if s.ok), None)
        if last is not None and facts.baseline is not None:
            entry = shop.STOCK_SYNC_ENTRY
            sent_counter = last.beat_sent.get(entry, 0) - facts.baseline.beat_sent.get(entry, 0)
        table = Table(show_header=False)
        table.add_column("what")
        table.add_column("value", justify="right")
        table.add_row(
            "beats running",
            ", ".join(f"{name} (pid {pid})" for pid, name in beat.beats.items()),
        )
        table.add_row(
            "slots due while they ran",
            f"{span} ({hhmmss(slots[0])} to {hhmmss(slots[-1])} UTC)" if slots else "0",
        )
        table.add_row(
            "slots sent (slot records in Redis)",
            f"{len(sent)}: " + ", ".join(f"{name} {n}" for name, n in by_beat.items()),
        )
        table.add_row("runs of the task (its own log)", str(len(beat.runs)))
        table.add_row("[bold]slots sent twice[/]", f"[bold]{len(twice)}[/]")
        table.add_row("slots due and not sent", str(missing))
        table.add_row("jobs_beat_sent_total over the run (exporter)", f"{sent_counter:g}")
        table.add_row(
            "stopped by SIGTERM",
            "both" if not beat.stuck else f"[red]not {', '.join(beat.stuck)} (SIGKILLed)[/]",
        )
        self.console.print(table)
        self.console.print(
            "Both beats compute the same slots; the leader (lock jobs:beat:leader:tasks) sends "
            "each one after recording it with SET NX under jobs:beat:slot:<entry>:<slot>, so "
            "even two leaders at once could not send a slot twice."
        )
        self.expect(
            "each beat slot sent once and run once",
            bool(slots)
            and not twice
            and missing == 0
            and not unsent_runs
            and len(beat.runs) == len(sent),
            f"{span} slots, {len(sent)} sent, {len(beat.runs)} runs, {len(twice)} twice, "
            f"{missing} missing",
        )
        self.expect(
            "both beats stopped on SIGTERM",
            not beat.stuck,
            "yes" if not beat.stuck else f"{', '.join(beat.stuck)} kept running: SIGKILLed",
        )

    # ------------------------------------------------------------------ 8. rate limit

    def rate_limit(self) -> None:
        facts = self.facts
        section(
            self.console,
            f"8. The warehouse's rate limit ({shop.WAREHOUSE_RATE} across every worker)",
        )
        rate = parse_rate(shop.WAREHOUSE_RATE, task=shop.reserve_stock.name)
        assert rate is not None
        limit = int(rate.count)
        starts = sorted(facts.reserve_starts)
        if not starts:
            self.expect("the rate limit held", False, "no reservation ran")
            return
        first = math.floor(starts[0])
        per_second = Counter(int(math.floor(t) - first) for t in starts)
        table = Table()
        table.add_column("second", justify="right")
        table.add_column("starts", justify="right")
        table.add_column("")
        for second in range(max(per_second) + 1):
            n = per_second.get(second, 0)
            table.add_row(str(second), str(n), "█" * n)
        self.console.print(table)
        busiest = max_in_window(starts, 1.0)
        deferred = 0.0
        last = next((s for s in reversed(facts.samples) if s.ok), None)
        if last is not None and facts.baseline is not None:
            deferred = last.deferred - facts.baseline.deferred
        self.console.print(
            f"{len(starts)} reservations in {starts[-1] - starts[0]:.1f} s; the most in any "
            f"1-second window: {busiest} (limit {limit}). Jobs over the limit were not run: "
            f"each was re-published to come back at its turn ({deferred:g} deferrals, "
            "jobs_rate_deferred_total), its pool slot free at once, no attempt used."
        )
        # The times are taken in the task, a moment after the limiter's decision (Redis's
        # clock): one start at a window's edge can land in the next window.
        self.expect(
            f"warehouse calls never over {shop.WAREHOUSE_RATE}",
            busiest <= limit + 1 and max(per_second.values()) <= limit + 1,
            f"at most {max(per_second.values())} in a calendar second, {busiest} in any 1 s window"
            " as the tasks timed their starts (a start timed a moment after the limiter's "
            "decision can land in the next second: one over the limit is that, not a breach)",
        )

    # ------------------------------------------------------------------ 9. services

    def services(self) -> None:
        facts = self.facts
        status = facts.flower_status
        self.expect(
            "Flower asked for a password and let the demo user in",
            status.get("without a password") == 401
            and status.get("with the demo credentials") == 200,
            ", ".join(f"{k}: HTTP {v}" for k, v in status.items()),
        )
        ok = [s.ok for s in facts.samples]
        self.expect(
            "the metrics exporter answered every scrape",
            bool(ok) and all(ok),
            f"{sum(ok)} of {len(ok)} scrapes",
        )

    # ------------------------------------------------------------------ 10. verdict

    def verdict(self) -> bool:
        section(self.console, "Expectations")
        table = Table(show_header=False)
        table.add_column("")
        table.add_column("expectation")
        table.add_column("seen")
        for check in self.checks:
            table.add_row(OK if check.ok else FAILED, check.what, check.detail)
        self.console.print(table)
        return all(c.ok for c in self.checks)

    def next_steps(self, chart: str) -> None:
        facts = self.facts
        stack = facts.stack
        database = ""
        if facts.database_url != _default_database():
            database = f"JOBS_DATABASE_URL={facts.database_url} "
        user, password = stack.flower_auth
        section(self.console, "Where to look next")
        lines = [
            f"chart of the run: [bold]{chart}[/]",
            f"logs of every process: {stack.log_dir}",
            f"dead letters, kept in the database: [bold]{database}celery -A tasks dlq list[/] "
            "(then dlq show ID)",
            f"Flower ran at {stack.flower_url} (user {user}, password {password}) and was "
            "stopped with the tour; its state is kept, so to look again run "
            f"[bold]{database}JOBS_FLOWER_BASIC_AUTH={user}:{password} "
            f"JOBS_FLOWER_DB={facts.demo_dir / 'flower.db'} celery -A tasks flower "
            "--port=5555 --address=127.0.0.1[/] and open http://127.0.0.1:5555",
            f"metrics ran at {stack.metrics_url} (stopped too)",
        ]
        if facts.broker is not None and facts.on_rabbitmq:
            lines.append(
                f"the broker was {facts.broker.describe()}; {facts.broker.fate()}. The "
                "delayed messages (the revoked reminders) went with the vhost, the metric "
                "counters and revoked ids with the Redis; the database and Flower's saved "
                "state remain"
            )
        elif facts.broker is not None:
            lines.append(
                f"the broker was {facts.broker.describe()}; {facts.broker.fate()}. Its queues, "
                "delayed jobs, metric counters and Flower's live view went with it; the "
                "database and Flower's saved state remain"
            )
        for line in lines:
            self.console.print(f"- {line}")


_ERROR = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\((?:'(?:[^'\\]|\\.)*'|\"[^\"]*\")\)")


def cause(retried: str) -> str:
    """The error a retry was for, out of the event's ``Retry(Retry(...), Error('...'))``."""
    found = _ERROR.findall(retried)
    return found[-1] if found else retried


def _invoice_of(reference: str) -> int | None:
    head, _, number = reference.partition("-")
    return int(number) if head == "invoice" and number.isdigit() else None


def _pid_of(sender: str) -> int:
    parts = sender.split(":")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else 0


def _default_database() -> str:
    return absolute_database_url("sqlite:///jobs_platform.sqlite3")


def max_in_window(times: list[float], window_s: float) -> int:
    """The most ``times`` in any half-open window ``[t, t + window_s)``."""
    best, start = 0, 0
    for end, t in enumerate(times):
        while t - times[start] >= window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


def print_report(console: Console, facts: Facts, chart: str) -> bool:
    """Print every section; True when every expectation held."""
    report = Report(console, facts)
    report.header()
    report.outcomes()
    report.retries()
    report.dead_letters()
    report.charges()
    checkout.report(report)
    report.kill()
    report.delayed()
    report.beat()
    report.rate_limit()
    if facts.fairness is not None and facts.on_rabbitmq:
        section(
            console,
            "8b. A tenant storm on the heavy queue (fairness_key is Redis-only: refused on "
            "RabbitMQ)",
        )
        fairness.report_fifo(console, facts.fairness, report.expect)
    elif facts.fairness is not None:
        section(console, "8b. A tenant storm on the heavy queue (fairness_key)")
        fairness.report(console, facts.fairness, report.expect)
    csv_import.report(report)
    outage.report(report)
    report.services()
    ok = report.verdict()
    report.next_steps(chart)
    return ok
