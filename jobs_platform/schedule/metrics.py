"""Beat's counters.

=====================================  ================================================
Metric (type: counter)                 Labels / meaning
=====================================  ================================================
``jobs_beat_sent_total``               ``entry``: runs sent (recorded for the exporter,
                                       :mod:`jobs_platform.metrics`, once beat starts)
``jobs_beat_skipped_total``            ``entry``, ``reason``: slots not sent by this
                                       beat; ``overlap`` (the previous run was still
                                       queued or running), ``missed`` (beat was down
                                       and the catch-up policy dropped it), ``taken``
                                       (another beat, or an earlier leader, had already
                                       sent it: not a lost run)
=====================================  ================================================

Beat serves no HTTP endpoint. The skip counts are kept in Redis
(:data:`jobs_platform.schedule.state.SKIPPED_KEY`), where the exporter reads them; the
prometheus-client counter here is this process's own view of them.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter

from jobs_platform import metrics
from jobs_platform.metrics import names
from jobs_platform.metrics.counters import RecordedCounter

SENT = RecordedCounter(names.BEAT_SENT)
SKIPPED = Counter("jobs_beat_skipped", names.BEAT_SKIPPED.help, ["entry", "reason"])
REASONS = ("overlap", "missed", "taken")


def on_beat_init(sender: Any = None, **_: Any) -> None:
    """Record beat's sends in the fleet's totals (a worker does it in its bootstep)."""
    app = getattr(sender, "app", None)
    if app is not None and getattr(app, "jobs_settings", None) is not None:
        metrics.activate(app)
