"""Every Prometheus metric of the dead-letter table, defined once.

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

from prometheus_client import Counter

DEAD_LETTERS = Counter("jobs_dead_letters", "New dead letters stored.", ["task", "queue", "reason"])
WRITE_FAILURES = Counter(
    "jobs_dead_letter_write_failures", "Dead-letter writes that failed, by stage.", ["stage"]
)
SPOOLED = Counter("jobs_dead_letter_spooled", "Dead letters written to the durable spool.")
WEBHOOK_REQUESTS = Counter(
    "jobs_dead_letter_webhook_requests", "Dead-letter webhook POSTs.", ["outcome"]
)
POISON_LABEL = "(poison)"
