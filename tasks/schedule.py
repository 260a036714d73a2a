"""The reference app's recurring jobs: Celery's ``beat_schedule``, run by ``celery -A tasks beat``.

One beat per environment is enough, two make it highly available: the platform's beat sends
each slot once, whichever beat sends it, and a standby takes over within seconds of the
leader dying (docs/recurring-jobs.md). Times are UTC. The policies are stated even where
they are the defaults, so a reader sees them:

- ``overlap="skip"``: a slot that comes while the entry's previous run is still queued or
  running is skipped (logged and counted), so a slow night never stacks two reports;
- ``catch_up=1``: after beat was down, at most one missed slot runs late, never a backlog.
"""

from __future__ import annotations

from typing import Any

from celery.schedules import crontab

from jobs_platform.schedule import maintenance_schedule
from tasks import partner, reports
from tasks.jobs import app

#: The account the hourly sync pushes (the fake partner answers 200 for account 1).
PARTNER_SYNC_ACCOUNT = 1

BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    "nightly-report": {
        "task": reports.nightly_report.name,
        "schedule": crontab(minute=0, hour=2),
        "options": {"overlap": "skip", "catch_up": 1},
    },
    "partner-sync-hourly": {
        "task": partner.sync_account.name,
        "schedule": crontab(minute=0),
        "args": (PARTNER_SYNC_ACCOUNT,),
        "options": {"overlap": "skip", "catch_up": 1},
    },
    # The platform's own upkeep: dead-letter retention, expired idempotency keys, a report
    # on unique-dispatch locks (jobs_platform/schedule/maintenance.py).
    **maintenance_schedule(app.jobs_settings),
}

app.conf.beat_schedule = BEAT_SCHEDULE
