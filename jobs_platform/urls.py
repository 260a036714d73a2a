"""Service URLs: the shape the platform accepts, and how they appear in messages (pure).

A broker URL is checked when the app is created, so a typo fails with the setting's name
instead of a ``ModuleNotFoundError`` from kombu or a hang at the first ``.delay()``.
Passwords never appear in an error or a log line: :func:`masked` hides them.
"""

from __future__ import annotations

import urllib.parse

from jobs_platform.errors import ConfigError

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


def check_broker_url(url: str, *, setting: str) -> str:
    """Refuse anything but ``redis[s]://[user:password@]host[:port][/db]``, naming ``setting``."""
    if url == f"{IN_PROCESS_SCHEME}://":
        return url
    shown = masked(url)
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"{setting}={shown!r} is not a valid URL: {exc}") from None
    if parts.scheme not in BROKER_SCHEMES:
        raise ConfigError(
            f"{setting}={shown!r}: the scheme must be "
            f"{' or '.join(f'{scheme}://' for scheme in BROKER_SCHEMES)} "
            "(jobs-platform runs on the Redis broker today)"
        )
    if not parts.hostname or not url.startswith(f"{parts.scheme}://"):
        raise ConfigError(
            f"{setting}={shown!r} has no host; expected {parts.scheme}://HOST[:PORT][/DB]"
        )
    database = parts.path.lstrip("/")
    if database and not database.isdigit():
        raise ConfigError(
            f"{setting}={shown!r}: the path must be a database number such as /0, "
            f"not {parts.path!r}"
        )
    if port == 0:
        raise ConfigError(f"{setting}={shown!r}: port 0 is not a port")
    return url
