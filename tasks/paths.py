"""Where the reference app keeps its files (outbox, media; under ``JOBS_APP_DATA``) and its
SQLite database."""

from __future__ import annotations

import os
from pathlib import Path

import sqlalchemy as sa


def data_dir() -> Path:
    return Path(os.environ.get("JOBS_APP_DATA", ".demo/appdata")).resolve()


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename: a crash never leaves half a file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def absolute_database_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute (every process must open one file,
    whatever its working directory)."""
    parsed = sa.engine.make_url(url)
    if parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
        path = Path(str(parsed.database))
        if not path.is_absolute():
            parsed = parsed.set(database=str(Path.cwd() / path))
    return parsed.render_as_string(hide_password=False)
