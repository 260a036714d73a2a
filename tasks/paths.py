"""Where the reference app keeps its files (outbox, media); under ``JOBS_APP_DATA``."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    return Path(os.environ.get("JOBS_APP_DATA", ".demo/appdata")).resolve()


def atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename: a crash never leaves half a file behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
