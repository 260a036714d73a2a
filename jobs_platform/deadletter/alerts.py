"""Alerts for new dead letters: one ERROR log line each, and an aggregated webhook.

The log line has the stable event name ``jobs.dlq.dead_letter`` both in the message (for
grep) and in ``extra["event"]`` (for structured handlers). The webhook is aggregated per
process: the first dead letter after a quiet period is POSTed at once, the rest of a
window are counted and sent in one summary per ``interval_s``, so a storm of 10,000 dead
letters costs a handful of requests, not 10,000. A failed POST is logged and counted,
never retried into the storm.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from jobs_platform.clock import utcnow
from jobs_platform.deadletter.metrics import WEBHOOK_REQUESTS
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.process_local import per_process

logger = logging.getLogger("jobs_platform.deadletter")

EVENT = "jobs.dlq.dead_letter"
WEBHOOK_EVENT = "jobs.dlq.dead_letters"
#: Groups and samples kept in one webhook summary (the payload stays small in a storm).
MAX_GROUPS = 20
MAX_SAMPLES = 5
POST_TIMEOUT_S = 5.0


def log_dead_letter(row_id: int, letter: DeadLetter) -> None:
    fields = {
        "event": EVENT,
        "dead_letter_id": row_id,
        "task_id": letter.task_id,
        "task_name": letter.task_name,
        "queue": letter.queue,
        "reason": letter.reason,
        "attempts": letter.attempts,
        "error_type": letter.error_type,
        "http_status": letter.http_status,
        "fingerprint": letter.fingerprint,
    }
    logger.error(
        "%s id=%d task=%s task_id=%s queue=%s reason=%s attempts=%d error=%s fingerprint=%s: %s",
        EVENT,
        row_id,
        letter.task_name,
        letter.task_id,
        letter.queue,
        letter.reason,
        letter.attempts,
        letter.error_type,
        letter.fingerprint,
        letter.error_message[:200],
        extra=fields,
    )


class WebhookNotifier:
    """Sends at most one POST per ``interval_s`` (plus a final flush at exit).

    ``clock`` is monotonic seconds with an arbitrary origin (on Linux, the uptime), so only
    differences between two of its readings mean anything.
    """

    def __init__(
        self, url: str, interval_s: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.url = url
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._groups: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._samples: list[dict[str, Any]] = []
        self._count = 0
        self._since = ""
        #: When the last POST went out; ``None`` until the first (which is never held).
        self._last_sent: float | None = None
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def notify(self, row_id: int, letter: DeadLetter) -> None:
        with self._lock:
            if self._count == 0:
                self._since = utcnow().isoformat()
            self._count += 1
            self._groups[(letter.task_name, letter.reason, letter.fingerprint)] += 1
            if len(self._samples) < MAX_SAMPLES:
                self._samples.append(
                    {
                        "id": row_id,
                        "task_id": letter.task_id,
                        "task_name": letter.task_name,
                        "queue": letter.queue,
                        "reason": letter.reason,
                        "error_type": letter.error_type,
                        "http_status": letter.http_status,
                        "error_message": letter.error_message[:200],
                    }
                )
            self._ensure_thread()
        self._wake.set()

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="jobs-dlq-webhook", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stopped:
            self._wake.wait()
            self._wake.clear()
            wait_s = self.window_left()
            if wait_s > 0:
                # The window: everything arriving meanwhile is merged (close() ends it).
                self._closing.wait(wait_s)
            self.flush()

    def window_left(self) -> float:
        """Seconds until the next POST may go (0 when none was sent yet)."""
        if self._last_sent is None:
            return 0.0
        return self._last_sent + self.interval_s - self.clock()

    def take(self) -> dict[str, Any] | None:
        """The pending summary (and reset), or ``None`` when nothing is pending."""
        with self._lock:
            if self._count == 0:
                return None
            summary = {
                "event": WEBHOOK_EVENT,
                "count": self._count,
                "since": self._since,
                "until": utcnow().isoformat(),
                "groups": [
                    {"task_name": t, "reason": r, "fingerprint": f, "count": n}
                    for (t, r, f), n in self._groups.most_common(MAX_GROUPS)
                ],
                "more_groups": max(len(self._groups) - MAX_GROUPS, 0),
                "samples": self._samples,
            }
            self._groups = collections.Counter()
            self._samples = []
            self._count = 0
            return summary

    def flush(self) -> None:
        summary = self.take()
        if summary is None:
            return
        self._last_sent = self.clock()
        request = urllib.request.Request(
            self.url,
            data=json.dumps(summary, default=str).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=POST_TIMEOUT_S) as response:
                response.read()
            WEBHOOK_REQUESTS.labels("ok").inc()
        except Exception as exc:  # the alert must not break the failure path
            WEBHOOK_REQUESTS.labels("error").inc()
            logger.warning(
                "jobs.dlq.webhook_failed: could not POST %d dead letter(s) to the webhook: %s",
                summary["count"],
                exc,
                extra={"event": "jobs.dlq.webhook_failed"},
            )

    def close(self) -> None:
        """Send what is pending now and stop the thread."""
        self._stopped = True
        self._closing.set()
        self._wake.set()
        self.flush()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=POST_TIMEOUT_S + 1)


def notifier_for(url: str, interval_s: float) -> WebhookNotifier:
    """This process's notifier for ``url`` (threads do not survive a fork)."""

    def start() -> WebhookNotifier:
        notifier = WebhookNotifier(url, interval_s)
        atexit.register(notifier.close)
        return notifier

    return per_process(("dead-letter-webhook", url), start)
