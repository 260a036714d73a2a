"""What a worker on a cooperative (gevent) pool needs to keep the platform's guarantees.

Celery's gevent pool enforces a hard time limit with ``gevent.Timeout``, raised where the
task yields (socket I/O, sleeps). Code that never yields (a CPU loop, a C call that holds
the GIL) or that swallows the Timeout keeps running, and its message would outlive the
visibility timeout and be delivered to a second worker while it still runs. And without
an event loop, kombu never restores expired messages, a full connection pool fails acks,
Celery builds a result backend per greenlet and sends task events one by one. So:

::

    policy.py    deadlines, grace, which running jobs are overdue, pool sizes, keys  (pure)
    watchdog.py  the monitor (a native OS thread that ends the worker when a job outlives
                 its hard limit + grace) and the lost-attempt accounting          (Celery, Redis)
    steps.py     the bootsteps: ``Cooperative`` (every worker: lost attempts; gevent: the
                 monitor, the restore sweep, the pool sizes) and ``BufferTaskEvents``

An ended worker's messages come back after the visibility timeout; the one that held the
worker counts as a lost worker, as a killed prefork child does (``task_retry_on_worker_lost``):
retried with the attempt in its history, and dead-lettered ``worker_lost`` once its retries
are spent. :class:`jobs_platform.startup.RefuseUnsafePool` requires ``Cooperative``, so
every worker of an app made by ``create_app`` has it.
"""

from __future__ import annotations

#: The worker bootstep, by name (only workers import it).
STEP = "jobs_platform.cooperative.steps:Cooperative"

__all__ = ["STEP"]
