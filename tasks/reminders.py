"""fast queue: remind a customer 24 hours after signing up.

A delay longer than the visibility timeout never waits in a worker's memory (where the
Redis broker would hand it to a second worker after the timeout, and it would run twice):
it waits in the delayed store on the broker and is released onto ``fast`` once, when due
(docs/delayed-jobs.md). The reminder file is keyed by the customer, so a redelivery
rewrites it instead of sending a second reminder.
"""

from __future__ import annotations

from typing import Any

from jobs_platform import ReliableTask
from tasks.jobs import app
from tasks.paths import atomic_write, data_dir

REMINDER_DELAY_S = 24 * 3600.0


@app.task(base=ReliableTask, bind=True, name="tasks.reminders.remind_customer", queue="fast")
def remind_customer(self: Any, customer_id: int) -> str:
    path = data_dir() / "outbox" / f"reminder-{customer_id}.eml"
    atomic_write(path, f"To: customer{customer_id}@example.com\nSubject: Still there?\n\n".encode())
    return str(path)


def schedule_reminder(customer_id: int, *, delay_s: float = REMINDER_DELAY_S) -> str:
    """Enqueue the reminder for ``delay_s`` from now (24 h by default); returns its task id,
    which ``AsyncResult(id).revoke()`` cancels until it is released."""
    return str(remind_customer.apply_async((customer_id,), countdown=delay_s).id)
