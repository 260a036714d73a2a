"""Ops commands, plugged into the ``celery`` CLI through the ``celery.commands`` entry point.

So ``celery -A tasks worker-profile fast`` works like ``celery -A tasks inspect``; each
command gets the app from ``ctx.obj.app``. Importing them is also when a ConfigError or
DispatchError at the command line is made one short message (:mod:`.errors`).
"""

from jobs_platform.cli import errors

errors.install()
