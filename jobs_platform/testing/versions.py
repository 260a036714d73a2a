"""``assert_versions_locked(app)``: the versions lock check as a test (docs/deploys.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jobs_platform import lockfile


def assert_versions_locked(app: Any, path: str | Path = lockfile.DEFAULT_PATH) -> None:
    """Fail, saying what changed, when ``app``'s tasks changed in a way queued jobs would
    not survive since the lock file at ``path`` was written (``celery -A APP versions
    check``, as a test: a signature changed without a version bump, a missing upcaster...)."""
    report = lockfile.compare(lockfile.read(path), lockfile.entries(app))
    if report.problems:
        raise AssertionError(
            f"task payloads changed since {path} was locked:\n  " + "\n  ".join(report.problems)
        )
