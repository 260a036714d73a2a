"""``celery -A APP health``: is every part of the platform up and doing its job?

::

    checks.py   one small function per check, returning a Check; pure verdicts
    canary.py   the canary task (install) and its round trip; busy or stuck?
    runner.py   runs the selected checks at once, bounded by the timeout
    keys.py     every Redis key read or written here

The command itself is :mod:`jobs_platform.cli.health`; what each check means is in
docs/health.md. :func:`install` registers the canary task on an app
(:func:`jobs_platform.create_app` calls it), so every worker can run it on any queue.
"""

from __future__ import annotations

from jobs_platform.health.canary import CANARY_TASK, install

__all__ = ["CANARY_TASK", "install"]
