"""The health checks' verdicts (pure): beat, spool, backlog, consumers, messages on one line."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from celery.schedules import crontab

from jobs_platform import history
from jobs_platform.brokers.interface import QueueState
from jobs_platform.brokers.redis import layout
from jobs_platform.clock import utc_iso
from jobs_platform.health import checks
from jobs_platform.health.checks import Check
from jobs_platform.settings import Settings
from jobs_platform.testing import dead_letter

NOW = dt.datetime(2026, 12, 2, 18, 0, tzinfo=dt.UTC)


def ago(seconds: float) -> dt.datetime:
    return NOW - dt.timedelta(seconds=seconds)


# -- messages ----------------------------------------------------------------------------------


def test_a_detail_is_one_line_cut_short_and_without_passwords() -> None:
    url = "redis://:p%40ss@127.0.0.1:1/0"
    secrets = checks.passwords(url, "redis://127.0.0.1/0")
    assert set(secrets) == {"p%40ss", "p@ss"}
    text = checks.one_line("auth p@ss failed\n  while\tconnecting " + "x" * 400, secrets)
    assert "p@ss" not in text and "\n" not in text and "\t" not in text
    assert text.startswith("auth *** failed while connecting")
    assert len(text) == checks.MAX_DETAIL and text.endswith("...")


def test_a_raising_check_is_a_failure_with_the_drivers_message() -> None:
    class Wrapped(Exception):
        orig = ConnectionRefusedError("refused by 127.0.0.1:1")

    def boom() -> tuple[bool, str]:
        raise Wrapped("page-long SQLAlchemy text")

    check = checks.timed("database", boom)
    assert check == Check(
        "database", False, "ConnectionRefusedError: refused by 127.0.0.1:1", check.elapsed_s
    )
    assert check.as_json()["ok"] is False


def test_sqlite_path_only_for_files() -> None:
    assert str(checks.sqlite_path("sqlite:////tmp/x/jobs.sqlite3")) == "/tmp/x/jobs.sqlite3"
    assert checks.sqlite_path("sqlite://") is None
    assert checks.sqlite_path("sqlite:///:memory:") is None
    assert checks.sqlite_path("postgresql+psycopg://u@h/db") is None


# -- consumers ---------------------------------------------------------------------------------


def test_consumers_lists_the_workers_of_each_queue() -> None:
    replies = {
        "b@h": [{"name": "fast"}, {"name": "thirdparty"}],
        "a@h": [{"name": "fast"}],
    }
    fast, heavy = checks.consumers(["fast", "heavy"], replies, wait_s=1.0, elapsed_s=1.0)
    assert fast.ok and fast.detail == "consumed by a@h, b@h"
    assert not heavy.ok
    assert "no worker consumes heavy (2 worker(s) answered within 1 s" in heavy.detail
    (alone,) = checks.consumers(["fast"], None, wait_s=1.0, elapsed_s=1.0)
    assert not alone.ok and "no worker answered within 1 s" in alone.detail


# -- beat --------------------------------------------------------------------------------------


def test_no_schedule_means_nothing_to_check() -> None:
    assert checks.schedule_gap_s({}, 300.0) is None
    assert checks.beat_verdict(None, {}, NOW)[0] is True


def test_the_tick_gap_is_the_shortest_interval_or_the_loop() -> None:
    schedule = {
        "a": {"schedule": 30.0},
        "b": {"schedule": dt.timedelta(seconds=5)},
        "c": {"schedule": crontab(minute="*/1")},
    }
    assert checks.schedule_gap_s(schedule, 300.0) == 5.0
    # A crontab's pace is left to beat's loop interval (lenient, never a false alarm).
    assert checks.schedule_gap_s({"c": {"schedule": crontab()}}, 300.0) == 300.0
    assert checks.schedule_gap_s({"a": {"schedule": 30.0}}, 2.0) == 2.0


@pytest.mark.parametrize(
    ("ticks", "ok", "words"),
    [
        ({}, False, "beat has never ticked (no tick at all)"),
        ({"a": "not a time"}, False, "beat has never ticked (no readable tick)"),
        ({"a": utc_iso(ago(3))}, True, "newest tick 3.0 s ago (a), bound 20 s"),
        (
            {"a": utc_iso(ago(600)), "b": utc_iso(ago(21))},
            False,
            "beat is silent: newest tick 21 s",
        ),
        ({"a": utc_iso(ago(600)), "b": utc_iso(ago(19))}, True, "newest tick 19 s ago (b)"),
    ],
)
def test_beat_is_judged_by_its_newest_tick(ticks: dict[str, str], ok: bool, words: str) -> None:
    verdict, detail = checks.beat_verdict(5.0, ticks, NOW)  # bound 2 x 5 + 10 = 20 s
    assert verdict is ok
    assert words in detail


# -- spool -------------------------------------------------------------------------------------


def letter(age_s: float) -> str:
    return dead_letter(failed_at=ago(age_s)).to_json()


def test_an_empty_or_draining_spool_passes() -> None:
    bound = checks.spool_bound_s(5.0)
    assert bound == 40.0
    assert checks.spool_verdict(0, None, NOW, bound) == (True, "empty")
    ok, detail = checks.spool_verdict(3, letter(2), NOW, bound)
    assert ok and detail == "3 dead letter(s) in the spool, the oldest 2.0 s"


def test_a_dead_letter_left_in_the_spool_fails_with_the_depth() -> None:
    ok, detail = checks.spool_verdict(7, letter(600), NOW, 40.0)
    assert not ok
    assert "not draining: 7 dead letter(s) in the spool, the oldest waiting 600 s" in detail


def test_an_unreadable_spool_head_fails() -> None:
    ok, detail = checks.spool_verdict(1, "{not json", NOW, 40.0)
    assert not ok and "1 entry in the spool" in detail


def test_dead_letters_set_aside_fail_the_spool_check_naming_the_cause() -> None:
    """A dead letter the database refused for good used to leave the check ok."""
    why = "billing.charge[abc]: StatementError: Object of type datetime is not JSON serializable"
    aside = checks.SetAside("jobs:dlq:spool", rejected=2, why=why)
    ok, detail = checks.spool_verdict(0, None, NOW, 40.0, aside)
    assert not ok
    assert detail.startswith(
        "2 dead letter(s) the database refused for good, in jobs:dlq:spool:rejected "
        "(ops/runbooks/dead-letter-set-aside.md); the latest: billing.charge"
    )
    assert detail.endswith(why)
    ok, detail = checks.spool_verdict(0, None, NOW, 40.0, checks.SetAside("s", unreadable=1))
    assert not ok and "1 unreadable entry in s:unreadable" in detail
    assert checks.spool_verdict(0, None, NOW, 40.0, checks.SetAside("s")) == (True, "empty")


# -- backlog -----------------------------------------------------------------------------------


def message(stamp: dt.datetime | None) -> str:
    headers = {} if stamp is None else {history.ENQUEUED_HEADER: utc_iso(stamp)}
    return json.dumps({"body": "", "headers": headers, "properties": {}})


def test_the_oldest_stamp_of_every_sub_list_counts() -> None:
    # The broker's reader takes the oldest stamp among the tails of a queue's sub-lists.
    tails = [message(ago(5)), None, message(ago(120)), message(None)]
    stamps = [s for s in map(layout.enqueued_at, tails) if s is not None]
    state = QueueState(9, min(stamps))
    ok, detail = checks.backlog_verdict(state, NOW, 60.0)
    assert not ok
    assert detail == "oldest waiting job 120 s old, objective 60 s (9 waiting)"
    ok, detail = checks.backlog_verdict(state, NOW, 900.0)
    assert ok and detail == "9 waiting, oldest 120 s (objective 900 s)"


def test_an_empty_queue_or_unstamped_messages_pass() -> None:
    empty = QueueState(0, None)
    assert checks.backlog_verdict(empty, NOW, 60.0) == (True, "empty (objective 60 s)")
    assert [layout.enqueued_at(t) for t in (message(None), "garbage")] == [None, None]
    ok, detail = checks.backlog_verdict(QueueState(2, None), NOW, 60.0)
    assert ok and "age unknown" in detail


def test_objectives_default_per_queue_and_a_setting_overrides() -> None:
    assert checks.objectives(Settings()) == {"fast": 60.0, "heavy": 900.0, "thirdparty": 300.0}

    mine = Settings(queue_objectives={"fast": 5, "heavy": 900, "thirdparty": 300})
    assert checks.objectives(mine)["fast"] == 5.0


def _reading(key: str, state: str, **kw: Any) -> Any:
    from jobs_platform.flow.breaker import Reading

    fields: dict[str, Any] = {
        "failures": 0,
        "threshold": 5,
        "window_s": 60.0,
        "cooldown_s": 30.0,
        "opened_at": None,
        "next_probe_in_s": None,
        "probe": None,
        "opens": 0,
    }
    return Reading(key=key, state=state, **{**fields, **kw})  # type: ignore[arg-type]


def test_an_open_breaker_is_a_warning_never_a_failure() -> None:
    assert checks.breakers_verdict([]) == (False, "no circuit breaker declared")
    assert checks.breakers_verdict([_reading("a", "closed")]) == (
        False,
        "1 breaker(s), all closed",
    )
    warn, detail = checks.breakers_verdict(
        [
            _reading("a", "closed"),
            _reading("partner-x", "open", next_probe_in_s=12.0, opened_at=1.0),
            _reading("partner-y", "half_open", probe="job-7"),
        ]
    )
    assert warn
    assert "2 of 3 breaker(s) not closed" in detail
    assert "partner-x open (next probe in 12 s)" in detail
    assert "partner-y half-open (probe job-7)" in detail
    assert "ops/runbooks/breaker-open.md" in detail
