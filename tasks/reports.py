"""heavy queue: the nightly report, sent by beat at 02:00 UTC (tasks/schedule.py).

The report is named after the night it is for, the slot beat sent it for (the
``jobs_beat_slot`` header), not after the moment it ran: a retry, a redelivery or a late
catch-up run rewrites the same file instead of adding a second report. Run by hand (no
header), it reports on today.
"""

from __future__ import annotations

import json
from typing import Any

from jobs_platform import ReliableTask
from jobs_platform.clock import utcnow
from jobs_platform.schedule import SLOT_HEADER
from jobs_platform.schedule.slots import parse_slot
from tasks.jobs import app
from tasks.paths import atomic_write, data_dir


@app.task(base=ReliableTask, bind=True, name="tasks.reports.nightly_report", queue="heavy")
def nightly_report(self: Any) -> str:
    slot = (self.request.headers or {}).get(SLOT_HEADER)
    day = (parse_slot(slot) if slot else utcnow()).date()
    outbox = data_dir() / "outbox"
    emails = sorted(outbox.glob("*.eml")) if outbox.is_dir() else []
    report = {"day": day.isoformat(), "slot": slot, "emails_in_outbox": len(emails)}
    path = data_dir() / "reports" / f"nightly-{day.isoformat()}.json"
    atomic_write(path, json.dumps(report, indent=2, sort_keys=True).encode())
    return str(path)
