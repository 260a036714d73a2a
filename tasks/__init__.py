"""The reference application: example tasks written the jobs-platform way.

Conventions: pass IDs, not objects (a queued message outlives the object it named);
one verb per task; every task declares its queue; side effects are idempotent (a
deterministic output path, a status compare-and-swap, a downstream idempotency key).

Start a worker per queue with ``celery -A tasks worker-profile fast`` (see docs/operations.md).
"""

# Importing the modules declares (and validates) their tasks on the app (tasks/jobs.py).
from tasks import (
    billing,
    email,
    imports,
    media,
    partner,
    reminders,
    reports,
    schedule,
    shop,
    tenants,
)
from tasks.jobs import app

__all__ = [
    "app",
    "billing",
    "email",
    "imports",
    "media",
    "partner",
    "reminders",
    "reports",
    "schedule",
    "shop",
    "tenants",
]
