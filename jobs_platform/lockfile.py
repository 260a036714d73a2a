"""The versions lock file: every task's name, payload version and signature, checked in.

A queued or delayed job outlives the code that dispatched it (up to ``JOBS_MAX_DELAY``).
Changing a task's arguments without bumping its ``version`` (and adding the upcaster) makes
every such job a ``version_skew`` dead letter at the deploy. The lock file records what the
payloads look like now (``celery -A APP versions lock`` writes it); :func:`changes` says what
a change of the code would break (``celery -A APP versions check``, and
:func:`jobs_platform.testing.assert_versions_locked` in a test), the way a migration check
catches a model change without a migration.

Only ReliableTasks are locked (they carry versions); the signature is the parameter list of
``run`` as Python prints it (return annotation left out: it is not in the payload).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Where ``versions lock`` writes and ``versions check`` reads, by default (the working dir).
DEFAULT_PATH = "jobs.lock.json"
FORMAT = 1

Entries = dict[str, dict[str, Any]]


def signature_of(task: Any) -> str:
    """``run``'s parameters as text (``self`` of a bound task left out)."""
    signature = inspect.signature(task.run)
    return str(signature.replace(return_annotation=inspect.Signature.empty))


def entries(app: Any) -> Entries:
    """Task name -> ``{"version", "signature", "upcast"}`` for every ReliableTask of ``app``
    (its modules imported as a worker imports them)."""
    app.loader.import_default_modules()
    found: Entries = {}
    for name, task in sorted(app.tasks.items()):
        spec = getattr(task, "spec", None)
        if spec is None or name.startswith("celery."):
            continue
        found[name] = {
            "version": spec.versions.version,
            "signature": signature_of(task),
            "upcast": sorted(spec.versions.upcast),
        }
    return found


def dumps(found: Entries) -> str:
    return json.dumps({"format": FORMAT, "tasks": found}, indent=2, sort_keys=True) + "\n"


def write(path: str | Path, found: Entries) -> None:
    Path(path).write_text(dumps(found), encoding="utf-8")


def read(path: str | Path) -> Entries:
    """The tasks of the lock file at ``path``; ValueError when it is not one."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path} is not a version-{FORMAT} jobs lock file")
    tasks = data.get("tasks")
    if not isinstance(tasks, dict):
        raise ValueError(f"{path} has no tasks object")
    return tasks


@dataclasses.dataclass(frozen=True)
class Report:
    """``problems``: changes queued jobs of the locked tasks would not survive (the check
    fails); ``notes``: safe changes the lock file does not record yet (re-lock)."""

    problems: list[str]
    notes: list[str]


def compare(locked: Mapping[str, Mapping[str, Any]], current: Mapping[str, Any]) -> Report:
    """The current tasks against the lock file's, one line per task that changed."""
    report = Report([], [])
    for name in sorted(set(locked) | set(current)):
        old, new = locked.get(name), current.get(name)
        if new is None:
            report.problems.append(
                f"{name}: in the lock file but no longer declared: its queued and delayed jobs "
                "would be poison dead letters (remove it once they drained, then re-lock)"
            )
        elif old is None:
            report.notes.append(f"{name}: new task, not in the lock file yet: re-lock")
        else:
            _compare_task(name, old, new, report)
    return report


def _compare_task(
    name: str, old: Mapping[str, Any], new: Mapping[str, Any], report: Report
) -> None:
    was, now = int(old.get("version", 1)), int(new["version"])
    if now < was:
        report.problems.append(
            f"{name}: version went down from {was} to {now}: queued payloads of version {was} "
            f"would wait for newer workers and die as version_skew"
        )
    elif now == was:
        if old.get("signature") != new["signature"]:
            report.problems.append(
                f"{name}: signature changed from {old.get('signature')} to {new['signature']} "
                f"but version is still {now}: declare version={now + 1} and "
                f"upcast={{{now}: ...}} (or, if every queued payload still binds, re-lock)"
            )
    else:
        missing = [k for k in range(was, now) if k not in set(new.get("upcast") or ())]
        if missing:
            report.problems.append(
                f"{name}: version bumped from {was} to {now} but there is no "
                f"{', '.join(f'upcast[{k}]' for k in missing)}: payloads of those versions "
                "could not run"
            )
        else:
            report.notes.append(
                f"{name}: version {was} -> {now} with its upcasters: re-lock to record it"
            )
