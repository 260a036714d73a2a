"""Ops commands, plugged into the ``celery`` CLI through the ``celery.commands`` entry point.

So ``celery -A tasks worker-profile fast`` works like ``celery -A tasks inspect``; each
command gets the app from ``ctx.obj.app``.
"""
