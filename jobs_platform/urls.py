"""Service URLs as they appear in messages (pure): passwords never appear in an error or a
log line, :func:`masked` hides them.

The broker URL's shape is checked when the app is created
(:func:`jobs_platform.brokers.check_urls`, and each broker's own ``check_url``).
"""

from __future__ import annotations

import urllib.parse


def masked(url: str) -> str:
    """``url`` with its password replaced by ``***`` (anything unparsable is shown as is);
    each entry of a ``;``-separated list (kombu's failover and Sentinel URLs) on its own."""
    if ";" in url:
        return ";".join(masked(entry) for entry in url.split(";"))
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    userinfo, _, hostinfo = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))
