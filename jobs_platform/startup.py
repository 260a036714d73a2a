"""Worker start-up checks that need the running worker (its pool), not just the app.

Every job must end by its hard time limit, which is only true if the pool *enforces* it:
the idempotency leases, the retry budget and the dead-letter reason ``time_limit`` rest on
it. Prefork kills the child at the limit. gevent raises ``gevent.Timeout`` in the task where
it yields (socket I/O, sleeps); code that never yields is covered by the watchdog
(:mod:`jobs_platform.cooperative`), which this check pulls into every worker. Celery's threads
and solo pools ignore hard limits, and eventlet is not watched, so a hung task there would
hold its job (and its lease) forever: such a worker is refused at start-up instead. So is a
prefetch multiplier above 1: with late acks a prefetched message waits unacknowledged
behind a running task, on a broker whose delivery timeout counts that wait too.
"""

from __future__ import annotations

import gc
from typing import Any

from celery import bootsteps
from celery.utils.text import str_to_list

from jobs_platform import rules


def pool_name(pool_cls: Any) -> str:
    module = pool_cls if isinstance(pool_cls, str) else getattr(pool_cls, "__module__", "")
    return str(module).rsplit(".", 1)[-1].replace("thread", "threads")


class FreezeBeforeFork(bootsteps.Step):  # type: ignore[misc]
    """Keep a prefork worker's children sharing their parent's memory.

    Children get the parent's pages copy-on-write, but their first garbage collection writes
    to the header of every object the parent built (imports, the app, SQLAlchemy...), so each
    child soon holds its own copy of most of them. Moving those objects into the permanent
    generation before the pool forks (``gc.freeze()``, the recipe in Python's ``gc`` docs)
    keeps the pages shared: the idle ``fast`` worker's PSS fell from 228 to 129 MB
    (``bench/memory.py``). Frozen objects are never collected; they are what a worker keeps
    for its whole life anyway.
    """

    label = "jobs-platform freeze before fork"

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        # Steps are built before any is started: the pool forks its children later.
        if pool_name(worker.pool_cls) == "prefork":
            gc.collect()
            gc.freeze()


class RefuseUnsafePool(bootsteps.Step):  # type: ignore[misc]
    """Refuse to start a worker whose pool does not enforce hard limits, or that prefetches."""

    label = "jobs-platform pool check"
    # Required steps join the worker with this one: a cooperative pool is safe only with
    # the watchdog (jobs_platform.cooperative), and prefork children share more memory
    # when the parent freezes its objects first.
    requires = ("jobs_platform.cooperative.steps:Cooperative", FreezeBeforeFork)

    def __init__(self, worker: Any, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        rules.check_pool(pool_name(worker.pool_cls))
        rules.check_prefetch(int(getattr(worker, "prefetch_multiplier", 1) or 1))


def with_queue_check(worker_cls: Any) -> Any:
    """``worker_cls`` refusing ``-Q`` names that are not declared, naming the ones that are.

    Celery's own message suggests enabling ``task_create_missing_queues``, which the platform
    pins off (a typo must not create a queue that nothing routes to).
    """

    class Worker(worker_cls):  # type: ignore[misc]
        def setup_queues(self, include: Any, exclude: Any = None) -> None:
            rules.check_queue_selection(
                [*(str_to_list(include) or ()), *(str_to_list(exclude) or ())],
                list(self.app.amqp.queues),
            )
            super().setup_queues(include, exclude)

    return Worker
