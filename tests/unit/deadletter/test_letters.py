"""What the failure receiver makes of the exception Celery hands it (pure: no worker).

In the pool child Celery replaces an exception it cannot pickle with a stand-in before
``task_failure`` fires; ReliableTask leaves the original on the request, and that wins.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
from billiard.exceptions import TimeLimitExceeded, WorkerLostError
from celery.app.task import Context
from celery.exceptions import Reject

from jobs_platform import history
from jobs_platform.deadletter import letters

RECORDED_503 = history.FinalFailure(
    outcome="exhausted",
    type="urllib.error.HTTPError",
    message="HTTP Error 503: Service Unavailable",
    at="2026-01-02T03:04:05.000+00:00",
    attempt=1,
    status=503,
)


def sender(task_id: str = "t-1", failure: history.FinalFailure | None = None) -> Any:
    context = Context(
        {
            "id": task_id,
            "retries": 0,
            "headers": {"jobs_enqueued_at": "2026-01-02T03:04:00+00:00"},
            "delivery_info": {"routing_key": "thirdparty", "priority": 0},
            "hostname": "w1@host",
            "args": ["k"],
            "kwargs": {},
        }
    )
    if failure is not None:
        setattr(context, history.FINAL_FAILURE_ATTR, failure)
    return SimpleNamespace(name="partner.charge", queue_class="thirdparty", request=context)


def letter_for(task: Any, exc: BaseException, task_id: str = "t-1") -> Any:
    return letters.failure_letter(task, task_id, exc, ["k"], {}, None)


def test_the_recorded_failure_wins_over_celerys_stand_in() -> None:
    # What urllib's HTTPError becomes on its way to task_failure: OSError(), no message.
    letter = letter_for(sender(failure=RECORDED_503), OSError())
    assert letter.reason == "exhausted"
    assert (letter.error_type, letter.error_message) == (
        "urllib.error.HTTPError",
        "HTTP Error 503: Service Unavailable",
    )
    assert letter.http_status == 503
    assert letter.errors[-1] == {
        "type": "urllib.error.HTTPError",
        "message": "HTTP Error 503: Service Unavailable",
        "at": "2026-01-02T03:04:05.000+00:00",
        "attempt": 1,
        "status": 503,
    }


def test_a_permanent_record_gives_reason_permanent() -> None:
    record = dataclasses.replace(
        RECORDED_503, status=404, outcome="permanent", message="HTTP Error 404"
    )
    letter = letter_for(sender(failure=record), OSError())
    assert (letter.reason, letter.http_status) == ("permanent", 404)
    assert letter.fingerprint != letter_for(sender(failure=RECORDED_503), OSError()).fingerprint


def test_a_record_of_another_task_is_not_used() -> None:
    # The request on the task object belongs to another task id: nothing of it applies.
    letter = letter_for(sender("other", failure=RECORDED_503), ValueError("bad"), task_id="t-1")
    assert (letter.reason, letter.error_type) == ("permanent", "builtins.ValueError")


@pytest.mark.parametrize(
    "record",
    [
        # What the note was before it was typed, and other things that are not a decision.
        {**dataclasses.asdict(RECORDED_503)},
        {**dataclasses.asdict(RECORDED_503), "outcome": "retried"},
        "exhausted",
    ],
)
def test_a_malformed_record_is_ignored(record: Any) -> None:
    task = sender()
    setattr(task.request, history.FINAL_FAILURE_ATTR, record)
    letter = letter_for(task, ValueError("bad"))
    assert (letter.reason, letter.error_type) == ("permanent", "builtins.ValueError")


def test_without_a_record_the_exception_itself_is_described() -> None:
    response = SimpleNamespace(status_code=502, headers={})
    exc = RuntimeError("bad gateway")
    exc.response = response  # type: ignore[attr-defined]
    letter = letter_for(sender(), exc)
    assert letter.reason == "permanent"
    assert (letter.error_type, letter.error_message) == ("builtins.RuntimeError", "bad gateway")
    assert letter.http_status == 502
    assert "status" not in letter_for(sender(), ValueError("x")).errors[-1]


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (TimeLimitExceeded(1.0), "time_limit"),
        (WorkerLostError("lost"), "worker_lost"),
        (Reject("malformed", requeue=False), "rejected"),
        (ValueError("plain task"), "permanent"),
    ],
)
def test_main_process_paths_keep_their_reason(exc: BaseException, reason: str) -> None:
    assert letters.reason_for(exc) == reason
    # In the main process the task's request is empty: no record to find.
    task = SimpleNamespace(name="partner.charge", queue_class="thirdparty", request=Context())
    assert letter_for(task, exc).reason == reason


def test_the_noted_failure_round_trips_and_outcomes_are_checked() -> None:
    context = Context({"id": "t-1"})
    failure = history.FinalFailure.of(OSError("HTTP Error 503"), 2, outcome="exhausted", status=503)
    history.note_final_failure(context, failure)
    assert history.final_failure(context) is failure
    assert failure.entry() == {
        "type": "builtins.OSError",
        "message": "HTTP Error 503",
        "at": failure.at,
        "attempt": 2,
        "status": 503,
    }
    with pytest.raises(ValueError, match="outcome"):
        history.FinalFailure("retried", "builtins.OSError", "x", failure.at, 1)  # type: ignore[arg-type]
