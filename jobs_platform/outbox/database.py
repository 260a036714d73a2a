"""Whether a session's database is the platform's (pure: URLs only).

A job written to the outbox of another database would never be published: no relay reads
it. The comparison is by what names a database (backend, host, port, database; for SQLite
the file), not by the URL's spelling: ``postgresql+psycopg://app@db/jobs`` and
``postgresql://jobs@db:5432/jobs`` are one database.
"""

from __future__ import annotations

import os

from sqlalchemy.engine import URL, make_url

_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1", ""})
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


def _host(url: URL) -> str:
    host = (url.host or "").lower()
    return "localhost" if host in _LOOPBACK else host


def same_database(a: str | URL, b: str | URL) -> bool:
    """Whether ``a`` and ``b`` name the same database."""
    first, second = make_url(a), make_url(b)
    backend = first.get_backend_name()
    if backend != second.get_backend_name():
        return False
    if backend == "sqlite":
        files = [url.database for url in (first, second)]
        if any(not name or name == ":memory:" for name in files):
            return False  # an in-memory database is private to its connection
        return os.path.realpath(str(files[0])) == os.path.realpath(str(files[1]))
    default = _DEFAULT_PORTS.get(backend)
    return (
        _host(first) == _host(second)
        and (first.port or default) == (second.port or default)
        and first.database == second.database
    )
