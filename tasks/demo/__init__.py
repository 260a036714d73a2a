"""``make demo``: the reference app as a shop, end to end on real services (docs/demo.md).

``python -m tasks.demo`` starts, on the embedded defaults, one worker per queue with its
profile, two beats, Flower and the metrics exporter; runs a shop's traffic (signups and
their emails, uploads and their thumbnails, a flash sale charged through a flaky payment
gateway under a rate-limited warehouse, one malformed order); SIGKILLs a worker with a
charge in flight; takes a partner down for a few seconds while its circuit breaker absorbs
the outage; and shows the queues live. Then it stops everything and prints what
happened, with the expectations that make it exit 1 when one does not hold, and writes a
chart of the run. ``--short`` (or ``JOBS_DEMO_SHORT=1``) runs the same steps smaller.

launch.py  options, the broker, start/stop/report
broker.py  which Redis: a private redis-server, or an empty database claimed on the user's
stack.py   the processes: workers, beats, Flower, exporter, gateway, partner stub
flaky.py   the payment gateway, flaky and slow on purpose
tour.py    the timeline: traffic, the kill, the delayed job, the beats; the facts
observe.py Celery's task events per job; the exporter's samples
live.py    the live table per queue
outage.py  the partner outage and its circuit breaker (report section 8d)
report.py  the report and its expectations
chart.py   the PNG
"""
