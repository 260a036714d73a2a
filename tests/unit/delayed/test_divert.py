"""The divert rule: a delay waits in the store unless wait + hard limit is safely below the
visibility timeout; Celery's own path keeps everything else."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from jobs_platform.brokers.redis.divert import due_ms, eta_of, hard_limit_of

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
VT = 6.0
MARGIN = 1.0


def message(
    wait_s: float | None, *, timelimit: Any = (2.0, None), task_id: str | None = "t-1"
) -> dict[str, Any]:
    headers: dict[str, Any] = {"id": task_id, "task": "app.send", "timelimit": timelimit}
    if wait_s is not None:
        headers["eta"] = (NOW + dt.timedelta(seconds=wait_s)).isoformat()
    return {"headers": headers, "properties": {"priority": 0}, "body": ""}


def decide(msg: dict[str, Any]) -> int | None:
    return due_ms(msg, now_s=NOW.timestamp(), visibility_timeout_s=VT, margin_s=MARGIN)


def test_a_wait_plus_hard_limit_at_the_budget_is_stored_at_its_eta() -> None:
    # budget = 6 - 1 = 5 s; 3 s wait + 2 s hard limit reaches it: a worker would hold the
    # message until it is due and still be running it when the broker redelivers it.
    assert decide(message(3.0)) == round((NOW.timestamp() + 3.0) * 1000)
    assert decide(message(18.0)) == round((NOW.timestamp() + 18.0) * 1000)
    assert decide(message(30 * 86400.0)) is not None


def test_a_wait_safely_below_the_budget_keeps_celerys_path() -> None:
    assert decide(message(2.9)) is None
    assert decide(message(4.9, timelimit=None)) is None


@pytest.mark.parametrize("wait_s", [None, 0.0, -60.0])
def test_no_eta_or_an_eta_already_past_is_never_stored(wait_s: float | None) -> None:
    assert decide(message(wait_s, timelimit=(1000.0, None))) is None


def test_a_message_without_a_task_id_or_with_a_bad_eta_keeps_the_normal_path() -> None:
    assert decide(message(60.0, task_id=None)) is None
    bad = message(60.0)
    bad["headers"]["eta"] = "tomorrow"
    assert decide(bad) is None
    assert decide({"body": "", "properties": {}}) is None


def test_the_hard_limit_is_the_larger_timelimit_value_in_either_order() -> None:
    assert hard_limit_of({"timelimit": [30.0, 20.0]}) == 30.0  # Celery sends [hard, soft]
    assert hard_limit_of({"timelimit": [None, 20]}) == 20.0
    assert hard_limit_of({"timelimit": [None, None]}) == 0.0
    assert hard_limit_of({"timelimit": "30"}) == 0.0
    assert hard_limit_of({"timelimit": [True, 4]}) == 4.0
    assert hard_limit_of({}) == 0.0
    # 1 s wait, 4.5 s hard limit: 5.5 s is beyond the 5 s budget.
    assert decide(message(1.0, timelimit=[4.5, 4.0])) is not None


def test_a_naive_eta_is_utc_like_celery_reads_it() -> None:
    assert eta_of({"eta": "2026-01-01T12:00:00"}) == NOW
    assert eta_of({"eta": "2026-01-01T13:00:00+01:00"}) == NOW
    assert eta_of({"eta": None}) is None
