"""The attempt history that travels with a message in its headers (pure; JSON only).

Each failed attempt appends ``{"type", "message", "at", "attempt"}``; the dead-letter
table shows the whole list. Only the newest entries are kept so a header cannot grow
without bound (``attempt`` keeps the numbering exact).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from jobs_platform.clock import utc_iso

ERRORS_HEADER = "jobs_errors"
ENQUEUED_HEADER = "jobs_enqueued_at"
#: Set by a dead-letter replay, so a replayed job that dies again links to its row.
REPLAY_OF_HEADER = "jobs_replay_of"
#: Set on a message put back because the worker holding it lost its lease (the value: that
#: worker's owner id; jobs_platform.brokers.redis.liveness): the delivery that takes it
#: counts a lost attempt. It describes one delivery, so a retry does not carry it.
LOST_WORKER_HEADER = "jobs_lost_worker"
#: A job deferred by a rate limit reserved this start (ms, the limiter's clock): it runs then
#: without asking again (jobs_platform.ratelimit). One delivery's too.
RATE_SLOT_HEADER = "jobs_rate_slot"
#: A job waiting for a slot of its concurrency key: the wait generation this copy belongs to
#: (jobs_platform.flow.concurrency). One delivery's too.
CONCURRENCY_GEN_HEADER = "jobs_conc_gen"
#: A debounced dispatch's trigger (jobs_platform.flow.debounce): the value is its key; the
#: trigger publishes the run, it never runs the task itself. Not one delivery's: a trigger
#: retried after a lost attempt must stay a trigger.
DEBOUNCE_HEADER = "jobs_debounce"
#: The payload version of the code that dispatched the job (jobs_platform.versions); a
#: message without it predates versions: version 1. The job's, not one delivery's.
VERSION_HEADER = "jobs_version"
#: When a worker first deferred a job whose payload is newer than its code (UTC ISO): the
#: skew window counts from there (jobs_platform.versions). A replay starts afresh.
VERSION_WAIT_HEADER = "jobs_version_wait"
#: The batch a job is a member of (jobs_platform.batches): its id. The job's, kept by retries
#: and replays.
BATCH_HEADER = "jobs_batch"
#: The member a replayed batch job stands for: the task id the member was first dispatched
#: with (a replay runs under a new id). Set by the replay; absent, the member is the task id.
BATCH_MEMBER_HEADER = "jobs_batch_member"
#: A dead letter's links to the canvas around the job (its group, chord callback, chain
#: remainder; jobs_platform.deadletter.letters.canvas_links). Stored, never sent again.
CANVAS_HEADER = "jobs_canvas"
#: Headers that describe one delivery of a job, not the job: an attempt's retry drops them.
PER_DELIVERY_HEADERS = (LOST_WORKER_HEADER, RATE_SLOT_HEADER, CONCURRENCY_GEN_HEADER)
#: Request attribute where ReliableTask hands the failure it gave up on (a
#: :class:`FinalFailure`) to the dead-letter receiver, as the task raised it: Celery swaps
#: an exception it cannot pickle (urllib's HTTPError, httpx's HTTPStatusError) for a
#: stand-in before ``task_failure`` fires.
FINAL_FAILURE_ATTR = "jobs_final_failure"
#: The outcomes a final failure can have (the dead-letter reason).
FINAL_OUTCOMES = ("exhausted", "permanent", "version_skew")
Outcome = Literal["exhausted", "permanent", "version_skew"]
#: Entries kept per message; max_retries is capped at 1000 but headers must stay small.
MAX_ENTRIES = 50
MAX_MESSAGE_CHARS = 1000


def qualified_name(obj: Any) -> str:
    """``module.QualName`` of a class or function: how errors and tasks are named."""
    return f"{obj.__module__}.{obj.__qualname__}"


def describe(exc: BaseException, attempt: int, *, at: str | None = None) -> dict[str, Any]:
    return entry(qualified_name(type(exc)), str(exc), attempt, at=at)


def entry(type_name: str, message: str, attempt: int, *, at: str | None = None) -> dict[str, Any]:
    return {
        "type": type_name,
        "message": message[:MAX_MESSAGE_CHARS],
        "at": at or utc_iso(),
        "attempt": attempt,
    }


@dataclasses.dataclass(frozen=True)
class FinalFailure:
    """The give-up decision of a ReliableTask, handed to the dead-letter code as made: the
    outcome (the dead-letter reason), the last error as raised and its HTTP status."""

    outcome: Outcome
    type: str
    message: str
    at: str
    attempt: int
    status: int | None = None

    def __post_init__(self) -> None:
        if self.outcome not in FINAL_OUTCOMES:
            raise ValueError(f"outcome must be one of {FINAL_OUTCOMES}, got {self.outcome!r}")

    @classmethod
    def of(
        cls, exc: BaseException, attempt: int, *, outcome: Outcome, status: int | None
    ) -> FinalFailure:
        item = describe(exc, attempt)
        return cls(outcome, item["type"], item["message"], item["at"], attempt, status)

    def entry(self) -> dict[str, Any]:
        """The last entry of the job's history (with ``status`` when there is one)."""
        item = entry(self.type, self.message, self.attempt, at=self.at)
        if self.status is not None:
            item["status"] = self.status
        return item


def note_final_failure(request: Any, failure: FinalFailure) -> None:
    """Leave ``failure`` on the running task's request for the dead-letter receiver."""
    setattr(request, FINAL_FAILURE_ATTR, failure)


def final_failure(request: Any) -> FinalFailure | None:
    """The final failure noted on ``request``, else ``None``."""
    info = getattr(request, FINAL_FAILURE_ATTR, None)
    return info if isinstance(info, FinalFailure) else None


def errors_of(headers: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    value = (headers or {}).get(ERRORS_HEADER) or []
    return list(value) if isinstance(value, list) else []


def with_error(headers: Mapping[str, Any] | None, item: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``headers`` for the next attempt: ``item`` appended to the history, what
    described the last delivery (:data:`PER_DELIVERY_HEADERS`) dropped."""
    new = {k: v for k, v in (headers or {}).items() if k not in PER_DELIVERY_HEADERS}
    new[ERRORS_HEADER] = [*errors_of(headers), item][-MAX_ENTRIES:]
    return new
