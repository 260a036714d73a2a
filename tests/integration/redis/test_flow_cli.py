"""The real ``celery -A APP flow list|show`` command, as a subprocess, on a Redis of its own:
concurrency keys with their holders and waiters, a rate key's pause, an open debounce
window, fairness keys with their backlog; JSON Lines on stdout; exit 1 for a key nothing is
known of."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.brokers.redis import fair
from jobs_platform.coordination.lease import Leases
from jobs_platform.flow.breaker import Breakers
from jobs_platform.flow.concurrency import Slots
from jobs_platform.flow.debounce import Windows
from jobs_platform.flow.options import Breaker
from jobs_platform.ratelimit import RateLimiter
from jobs_platform.testing import RedisServer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
APP = "tests.support.flow_app"
SEP = "\x06\x16"  # kombu's


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture()
def seeded(server: RedisServer) -> dict[str, str]:
    """Account A: limit 2, two running, one waiting; partner-x paused 60 s; one window of
    document 42 with three dispatches."""
    client = redis.Redis.from_url(server.url)
    client.flushdb()
    slots = Slots(client)
    for job in ("job-1", "job-2", "job-3"):
        slots.take(
            "acct-A",
            2,
            owner=job,
            generation=None,
            new_generation=job,
            record="{}",
            ttl_s=15,
            fallback_max_s=15,
        )
    RateLimiter(client).pause("partner-x", 60)
    windows = Windows(client)
    for n in range(3):
        windows.dispatch(
            "flow.reindex",
            "doc-42",
            new_id=f"run-{n}",
            arguments="[[],{}]",
            window_s=30,
            max_s=300,
        )
    ring = fair.ring_key("heavy", SEP)
    for key in ("tenant-big", "tenant-big", "tenant-big", "tenant-small"):
        client.eval(*fair.publish_args(ring, key, "{}"))
    return {
        **{k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")},
        "JOBS_BROKER_URL": server.url,
        "PYTHONPATH": str(ROOT),
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "flow", *args],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def rows(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def test_list_shows_each_keys_limit_running_waiting_and_state(seeded: dict[str, str]) -> None:
    done = cli(seeded, "list", "--json")
    assert done.returncode == 0, done.stderr
    by_kind = {(r["kind"], r["key"]): r for r in rows(done.stdout)}
    conc = by_kind["concurrency", "acct-A"]
    assert (conc["limit"], conc["running"], conc["waiting"]) == (2, 2, 1)
    rate = by_kind["rate", "partner-x"]
    assert rate["limit"] == "5/1s" and rate["tasks"] == ["flow.partner"]
    assert 50 < rate["paused_for_s"] <= 60
    window = by_kind["debounce", "doc-42"]
    assert window["task"] == "flow.reindex" and window["run_id"] == "run-0"
    assert window["dispatches"] == 3 and 25 < window["due_in_s"] <= 30

    table = cli(seeded, "list")
    assert table.returncode == 0, table.stderr
    assert "acct-A" in table.stdout and "paused" in table.stdout and "run-0" in table.stdout


def test_show_names_the_holders_and_the_waiters_oldest_first(seeded: dict[str, str]) -> None:
    done = cli(seeded, "show", "acct-A", "--json")
    assert done.returncode == 0, done.stderr
    [shown] = rows(done.stdout)
    running = {h["task_id"] for h in shown["concurrency"]["running"]}
    assert running == {"job-1", "job-2"}
    assert [w["task_id"] for w in shown["concurrency"]["waiting"]] == ["job-3"]
    assert shown["rate"] is None and shown["debounce"] == []

    text = cli(seeded, "show", "doc-42")
    assert text.returncode == 0, text.stderr
    assert "run run-0" in text.stdout and "3 dispatch(es)" in text.stdout


def test_show_of_an_unknown_key_says_so_and_exits_1(seeded: dict[str, str]) -> None:
    done = cli(seeded, "show", "no-such-key")
    assert done.returncode == 1
    assert "nothing is known of flow key 'no-such-key'" in done.stderr
    assert done.stdout == ""


def test_list_and_show_give_each_fairness_keys_backlog_and_place(seeded: dict[str, str]) -> None:
    done = cli(seeded, "list", "--json")
    assert done.returncode == 0, done.stderr
    fair_rows = [r for r in rows(done.stdout) if r["kind"] == "fairness"]
    assert [(r["queue"], r["key"], r["waiting"], r["position"]) for r in fair_rows] == [
        ("heavy", "tenant-big", 3, 0),
        ("heavy", "tenant-small", 1, 1),
    ]
    table = cli(seeded, "list")
    assert "tenant-small" in table.stdout and "queue heavy" in table.stdout

    shown = cli(seeded, "show", "tenant-small", "--json")
    assert shown.returncode == 0, shown.stderr
    assert rows(shown.stdout)[0]["fairness"] == [{"queue": "heavy", "backlog": 1, "position": 1}]
    text = cli(seeded, "show", "tenant-big")
    assert "fairness (queue heavy): 3 waiting, 0 key(s) ahead" in text.stdout


def test_list_and_show_give_each_breakers_state_failures_and_next_probe(
    seeded: dict[str, str],
) -> None:
    client = redis.Redis.from_url(seeded["JOBS_BROKER_URL"])
    breakers = Breakers(client, Leases(client))
    # flaky-partner (flow.downstream: 3 in a row) opened; partner-q counted 1 failure.
    opened = Breaker("flaky-partner", threshold=3, window_s=60, cooldown_s=120)
    for n in range(3):
        breakers.failed(opened, f"job-{n}", f"job-{n}:0")
    other = Breaker("partner-q", threshold=5)
    assert breakers.admit(other, "job-q", probe_ttl_s=10).run  # a job asks, then fails
    breakers.failed(other, "job-q", "job-q:0")
    done = cli(seeded, "list", "--json")
    assert done.returncode == 0, done.stderr
    by_key = {r["key"]: r for r in rows(done.stdout) if r["kind"] == "breaker"}
    flaky = by_key["flaky-partner"]
    assert flaky["state"] == "open" and flaky["limit"] == "3 failures" and flaky["opens"] == 1
    assert 110 < flaky["next_probe_in_s"] <= 120 and flaky["opened_at"] is not None
    # A key only a job asked for (no task of this app declares it) is listed too.
    assert by_key["partner-q"]["state"] == "closed" and by_key["partner-q"]["failures"] == 1
    table = cli(seeded, "list")
    assert "flaky-partner" in table.stdout and "next probe in" in table.stdout

    text = cli(seeded, "show", "flaky-partner")
    assert text.returncode == 0, text.stderr
    assert "breaker: open, opened at " in text.stdout
    assert "opens after 3 failures in a row within 60 s; cool-down 120 s" in text.stdout
    shown = rows(cli(seeded, "show", "partner-q", "--json").stdout)[0]
    assert shown["breaker"]["failures"] == 1 and shown["breaker"]["threshold"] == 5
