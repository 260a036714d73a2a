"""Service URLs: the shape the platform accepts, and how they appear in messages (pure).

The broker URL's shape is checked when the app is created
(:func:`jobs_platform.rules.check_broker_url`).
Passwords never appear in an error or a log line: :func:`masked` hides them.
"""

from __future__ import annotations

import urllib.parse

#: Broker transports the platform supports today (its redelivery and dead-letter spool rely
#: on Redis; RabbitMQ comes later).
BROKER_SCHEMES = ("redis", "rediss")
#: kombu's in-process transport: accepted for pure unit tests, which never start a worker.
IN_PROCESS_SCHEME = "memory"


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***`` (anything unparsable is shown as is)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))
