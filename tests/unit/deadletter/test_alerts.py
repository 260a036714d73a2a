"""Alerts: one ERROR line per dead letter; a webhook storm costs a bounded number of POSTs."""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from jobs_platform.deadletter import alerts
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.testing import FakeClock, dead_letter, free_port, wait_for


def letter(n: int, task: str = "billing.charge") -> DeadLetter:
    return dead_letter(task_id=f"t-{n}", task_name=task, message=f"refused #{n}")


class Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers["Content-Length"])
        type(self).bodies.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture()
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    bodies: list[dict[str, Any]] = []
    handler = type("H", (Receiver,), {"bodies": bodies})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", bodies
    server.shutdown()
    server.server_close()


def test_each_dead_letter_logs_one_structured_error_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="jobs_platform.deadletter"):
        alerts.log_dead_letter(7, letter(1))
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.event == alerts.EVENT  # type: ignore[attr-defined]
    assert record.dead_letter_id == 7  # type: ignore[attr-defined]
    assert record.getMessage().startswith("jobs.dlq.dead_letter id=7 task=billing.charge")


def test_webhook_storm_of_10000_sends_a_bounded_number_of_requests(
    webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = webhook
    # A window far longer than the storm takes on any machine: the bound below does not
    # depend on how fast 10,000 notify() calls run. close() sends the open window.
    notifier = alerts.WebhookNotifier(url, interval_s=600)
    for n in range(10_000):
        notifier.notify(n, letter(n, task=f"task{n % 3}"))
    wait_for(lambda: bodies, timeout_s=10, message="the first POST, sent at once")
    notifier.close()
    wait_for(
        lambda: sum(b["count"] for b in bodies) == 10_000,
        timeout_s=10,
        message=lambda: f"all 10,000 counted (got {sum(b['count'] for b in bodies)})",
    )
    # The first POST goes at once, the rest of the storm is merged into one summary.
    assert len(bodies) == 2, [b["count"] for b in bodies]
    assert all(len(b["samples"]) <= alerts.MAX_SAMPLES for b in bodies)
    merged: dict[str, int] = {}
    for body in bodies:
        assert body["event"] == alerts.WEBHOOK_EVENT
        for group in body["groups"]:
            merged[group["task_name"]] = merged.get(group["task_name"], 0) + group["count"]
    assert merged == {"task0": 3334, "task1": 3333, "task2": 3333}


def webhook_requests(outcome: str) -> float:
    sample = REGISTRY.get_sample_value(
        "jobs_dead_letter_webhook_requests_total", {"outcome": outcome}
    )
    return sample or 0.0


def test_webhook_failure_is_logged_and_counted_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    notifier = alerts.WebhookNotifier(f"http://127.0.0.1:{free_port()}/dead", interval_s=0.1)
    errors, oks = webhook_requests("error"), webhook_requests("ok")
    with caplog.at_level(logging.WARNING, logger="jobs_platform.deadletter"):
        notifier.notify(1, letter(1))  # flushed by the notifier's thread: must not raise
        wait_for(
            lambda: any("jobs.dlq.webhook_failed" in r.getMessage() for r in caplog.records),
            timeout_s=10,
            message="the webhook failure to be logged",
        )
    notifier.close()
    [line] = [r for r in caplog.records if "jobs.dlq.webhook_failed" in r.getMessage()]
    assert line.levelno == logging.WARNING and "1 dead letter(s)" in line.getMessage()
    # Counted once as an error (the counter is incremented before the line is logged).
    assert webhook_requests("error") == errors + 1
    assert webhook_requests("ok") == oks


def test_first_webhook_is_sent_at_once_on_a_machine_that_booted_seconds_ago(
    webhook: tuple[str, list[dict[str, Any]]],
) -> None:
    url, bodies = webhook
    # time.monotonic() on Linux is the uptime: 3.0 is a machine 3 s after boot, far less
    # than one interval. The first dead letter must not wait for a previous POST that
    # never happened.
    clock = FakeClock(monotonic_start=3.0)
    notifier = alerts.WebhookNotifier(url, interval_s=600, clock=clock.monotonic)
    try:
        notifier.notify(1, letter(1))
        wait_for(lambda: bodies, timeout_s=10, message="the first POST, sent at once")
        assert [b["count"] for b in bodies] == [1]
        # The window still holds: one second later, the next one waits for it.
        clock.advance(1.0)
        notifier.notify(2, letter(2))
        assert notifier.window_left() == pytest.approx(599.0)
        assert len(bodies) == 1
    finally:
        notifier.close()
    wait_for(lambda: len(bodies) == 2, timeout_s=10, message="the held one, sent at close")
    assert bodies[1]["count"] == 1
