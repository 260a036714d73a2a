"""The live view: per queue, jobs sent, waiting, in flight, done, failed and retried.

Waiting and in flight are the exporter's gauges (``celery_queue_length``, ``jobs_inflight``);
done, failed and retried are its counters (summed in Redis by every worker process, flushed
every 2 s) minus their values when the tour started; sent comes from the task events. On a
terminal it is a table redrawn twice a second under the tour's log lines; in a pipe (CI, a
test) it prints a one-line summary every 10 s instead.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tasks.demo.observe import QUEUES, EventLog, Sampler

PIPE_SUMMARY_EVERY_S = 10.0


class LiveView:
    def __init__(self, console: Console, sampler: Sampler, events: EventLog, since: float) -> None:
        self.console = console
        self.sampler = sampler
        self.events = events
        self.since = since
        self.phase = "starting"
        #: A step's own progress (the import's chunks settled), under the table while set.
        self.progress = ""
        self._live: Live | None = None
        self._last_line = 0.0

    def say(self, message: str) -> None:
        """A line of the tour's story, with the time since the workload began."""
        self.console.print(f"[dim]{time.time() - self.since:6.1f}s[/] {message}")

    def counts(self) -> dict[str, dict[str, int]]:
        sample = self.sampler.latest
        sent = self.events.sent_per_queue(self.since)
        rows: dict[str, dict[str, int]] = {}
        for queue in QUEUES:
            rows[queue] = {
                "sent": sent.get(queue, 0),
                "waiting": int(sample.waiting.get(queue, 0)),
                "in flight": int(sample.inflight.get(queue, 0)),
                "done": int(self.sampler.delta(sample, "succeeded", queue)),
                "failed": int(self.sampler.delta(sample, "failed", queue)),
                "retried": int(self.sampler.delta(sample, "retried", queue)),
            }
        return rows

    def render(self) -> Any:
        sample = self.sampler.latest
        table = Table(
            title=f"{self.phase}  ({time.time() - self.since:.0f} s)",
            title_justify="left",
        )
        table.add_column("queue")
        for name in ("sent", "waiting", "in flight", "done", "failed", "retried"):
            table.add_column(name, justify="right")
        for queue, row in self.counts().items():
            table.add_row(queue, *(str(v) for v in row.values()))
        beat = sum(sample.beat_sent.values()) - sum(self.sampler.baseline.beat_sent.values())
        footer = Text(
            f"delayed store: {int(sample.delayed)} waiting   "
            f"rate-limit deferrals: {int(sample.deferred - self.sampler.baseline.deferred)}   "
            f"beat runs sent: {int(beat)}",
            style="dim",
        )
        if self.progress:
            return Group(table, footer, Text(self.progress, style="bold"))
        return Group(table, footer)

    def tick(self) -> None:
        """Called from the tour's wait loops: in a pipe, a summary line now and then."""
        if self._live is not None or time.time() - self._last_line < PIPE_SUMMARY_EVERY_S:
            return
        self._last_line = time.time()
        parts = [
            f"{q}: {r['done']} done, {r['waiting']} waiting, {r['in flight']} in flight"
            for q, r in self.counts().items()
        ]
        self.say("[dim]" + "; ".join(parts) + "[/]")

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self._live = Live(
                get_renderable=self.render,
                console=self.console,
                refresh_per_second=2,
                transient=False,
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None
