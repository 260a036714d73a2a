"""Every Prometheus counter of the dead-letter table (names and help: jobs_platform.metrics.names).

================================================  ==============================
Metric (type: counter)                            Labels / meaning
================================================  ==============================
``jobs_dead_letters_total``                       ``task``, ``queue``, ``reason``:
                                                  new rows (a chain counts once)
``jobs_dead_letter_write_failures_total``         ``stage``: ``db`` (kept in the
                                                  spool), ``spool`` (broker down),
                                                  ``lost`` (both: only the log has
                                                  it), ``receiver`` (capture bug),
                                                  ``rejected`` (refused for good:
                                                  moved to ``<spool>:rejected``),
                                                  ``unreadable`` (not a dead letter:
                                                  moved to ``<spool>:unreadable``)
``jobs_dead_letter_spooled_total``                dead letters written to the spool
``jobs_dead_letter_webhook_requests_total``       ``outcome``: ``ok`` / ``error``
================================================  ==============================

Poison messages are labelled ``task="(poison)"``: their task names come from the message
and would make the label set unbounded.
"""

from __future__ import annotations

from jobs_platform.metrics import names
from jobs_platform.metrics.counters import RecordedCounter

# Recorded for the exporter (summed over every worker process in the broker's Redis,
# jobs_platform.metrics), and still kept per process as prometheus-client counters.
DEAD_LETTERS = RecordedCounter(names.DEAD_LETTERS)
WRITE_FAILURES = RecordedCounter(names.DEAD_LETTER_WRITE_FAILURES)
SPOOLED = RecordedCounter(names.DEAD_LETTER_SPOOLED)
WEBHOOK_REQUESTS = RecordedCounter(names.DEAD_LETTER_WEBHOOK_REQUESTS)
POISON_LABEL = "(poison)"
