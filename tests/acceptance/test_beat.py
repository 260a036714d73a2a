"""Real ``celery -A APP beat`` processes and a real worker: each slot enqueued once with two
beats, across a leader SIGKILL; catch-up after downtime; overlapping runs skipped. And the
failure it prevents: two plain Celery beats send every slot twice.

The runs record the slot they were sent for (``jobs_beat_slot``) in Redis. The two-beat
run is ~5 s before and ~4 s after the kill by default; ``JOBS_LONG_TESTS=1`` runs the 30 s
version (15 s + 12 s) with the same assertions.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from jobs_platform.schedule.leader import leader_key
from jobs_platform.schedule.slots import SKIPPED_MARK, SLOT_PREFIX, parse_slot
from jobs_platform.schedule.state import BeatState
from jobs_platform.settings import Settings
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT

pytestmark = pytest.mark.acceptance

APP = "tests.support.beat_app"
LOOP_INTERVAL_S = 1.0
#: How late a beat's tick may start: the beats are processes on a loaded 2-core machine
#: (workers, other suites). Well above a scheduling delay, well below what a failover that
#: waits for anything but the lock would show (another lock timeout, or never).
TICK_LATE_S = 2.0
#: The documented failover bound: the lock runs out (its timeout after the leader's last
#: extension) and the standby sees it on its next tick, which may start late.
FAILOVER_BOUND_S = Settings().beat_lock_timeout + LOOP_INTERVAL_S + TICK_LATE_S
LONG = os.environ.get("JOBS_LONG_TESTS") == "1"


class BeatProcess:
    """A real ``celery beat`` in its own process group, with its own schedule file."""

    def __init__(self, env: dict[str, str], tmp: Path, name: str, *extra: str) -> None:
        self.name = name
        self.env = env
        self.log_path = tmp / f"beat-{name}.log"
        self.argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            APP,
            "beat",
            "-l",
            "info",
            "-s",
            str(tmp / f"beat-{name}-schedule"),
            "--pidfile",
            str(tmp / f"beat-{name}.pid"),
            *extra,
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> BeatProcess:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_log(self, text: str, timeout_s: float = 30) -> None:
        def seen() -> bool:
            if not self.alive():
                raise RuntimeError(f"beat {self.name} exited:\n{self.log()[-3000:]}")
            return text in self.log()

        wait_for(seen, timeout_s=timeout_s, message=lambda: f"{text!r} in beat {self.name}'s log")

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM, as systemd or Kubernetes stop it; SIGKILL if it lingers."""
        if not self.alive():
            return
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture(scope="module")
def beat_worker(
    worker_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with WorkerProcess(
        APP,
        ["fast"],
        concurrency=2,
        env=worker_env,
        cwd=str(ROOT),
        log_dir=str(tmp_path_factory.mktemp("beat-worker")),
    ) as worker:
        yield worker


@pytest.fixture()
def client(redis_url: str) -> Iterator[redis.Redis]:
    conn = redis.Redis.from_url(redis_url)
    yield conn
    conn.delete(leader_key("beatapp"))  # a killed leader's lock must not delay the next test
    conn.close()


@pytest.fixture()
def beats(worker_env: dict[str, str], tmp_path: Path, beat_worker: WorkerProcess) -> Iterator[Any]:
    """``beats(entries, name, *extra)`` starts a beat over ``entries``; all stopped at the end."""
    started: list[BeatProcess] = []

    def start(entries: dict[str, Any], name: str, *extra: str) -> BeatProcess:
        env = {**os.environ, **worker_env, "JPTEST_BEAT_ENTRIES": json.dumps(entries)}
        proc = BeatProcess(env, tmp_path, name, *extra).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


def runs(client: redis.Redis, key: str) -> list[dict[str, Any]]:
    return [json.loads(item) for item in client.lrange(f"jptest:beat:{key}", 0, -1)]


def slot_times(records: list[dict[str, Any]]) -> list[float]:
    return sorted(parse_slot(r["slot"]).timestamp() for r in records)


def leader_pid(client: redis.Redis) -> int | None:
    holder = client.get(leader_key("beatapp"))
    return None if holder is None else pid_of(holder)


def pid_of(holder: bytes) -> int:
    return int(holder.decode().split(":")[1])


def enqueued(record: dict[str, Any]) -> float:
    """When the beat sent this run: its own stamp in the message, not when a test saw it."""
    return parse_slot(record["enqueued"]).timestamp()


def lock_left(client: redis.Redis, pid: int) -> tuple[float, float]:
    """(seconds left, epoch time it runs out) of the lock of the dead leader ``pid``, on the
    broker's clock."""
    pipe = client.pipeline()  # MULTI/EXEC: holder, TTL and clock at one moment
    pipe.get(leader_key("beatapp"))
    pipe.pttl(leader_key("beatapp"))
    pipe.time()
    holder, ttl_ms, (seconds, micros) = pipe.execute()
    now = seconds + micros / 1e6
    if holder is None or pid_of(holder) != pid:
        return 0.0, now  # ran out already (the standby may hold a fresh one)
    assert ttl_ms >= 0, f"the leader lock has no TTL ({ttl_ms})"
    return ttl_ms / 1000, now + ttl_ms / 1000


def wait_consumed(client: redis.Redis, key: str, entry: str) -> list[dict[str, Any]]:
    """Every slot a beat sent has run: one run per slot record not marked skipped."""
    sent = sum(
        1
        for record in client.scan_iter(match=f"{SLOT_PREFIX}{entry}:*")
        if not (client.get(record) or b"").decode().startswith(SKIPPED_MARK)
    )
    return wait_for(
        lambda: (found := runs(client, key)) and len(found) >= sent and found,
        timeout_s=30,
        message=lambda: f"{sent} runs of {entry} (have {len(runs(client, key))})",
    )


def every_second(key: str, task: str = "beat.record_slot", **options: Any) -> dict[str, Any]:
    return {"task": task, "every": 1, "args": [key], "options": options}


@pytest.mark.slow
def test_two_beats_enqueue_each_slot_once_and_the_standby_takes_over_a_killed_leader(
    beats: Any, client: redis.Redis
) -> None:
    key = uuid.uuid4().hex[:8]
    entry = f"every-second-{key}"
    entries = {entry: every_second(key, overlap="allow")}
    before_s, after_s = (15, 12) if LONG else (5, 4)

    first = beats(entries, "a")
    wait_for(lambda: leader_pid(client) == first.pid, timeout_s=30, message="beat a leads")
    second = beats(entries, "b")
    second.wait_log("stands by")
    wait_for(lambda: len(runs(client, key)) >= before_s, timeout_s=before_s + 15, message="runs")

    killed_at = time.time()  # the leader lived until at least here
    first.kill()
    dead_at = time.time()  # and sent nothing after here
    left_s, lock_runs_out_at = lock_left(client, first.pid)  # read once no one can extend it
    wait_for(
        lambda: leader_pid(client) == second.pid,
        timeout_s=FAILOVER_BOUND_S + 10,
        interval_s=0.02,
        message="beat b takes over",
    )
    seen_leading_at = time.time()
    wait_for(
        lambda: sum(1 for s in slot_times(runs(client, key)) if s > seen_leading_at) >= after_s,
        timeout_s=after_s + 15,
        message="runs after the takeover",
    )
    second.stop()
    records = wait_consumed(client, key, entry)

    slots = slot_times(records)
    assert len(slots) == len(set(slots)), "a slot was enqueued twice"
    assert len({r["task_id"] for r in records}) == len(records)
    assert {r["entry"] for r in records} == {entry}
    # The takeover as the beats record it: the standby's first send, by its own stamp (the
    # test's polling would add its own delays on a loaded machine).
    first_after = min(sent for r in records if (sent := enqueued(r)) > dead_at)
    takeover_s = first_after - dead_at
    # Exactly when the bound says: the dead leader's lock ran out (the broker's TTL and
    # clock), then the standby's next tick; and so within the documented bound.
    assert left_s <= Settings().beat_lock_timeout
    assert first_after <= lock_runs_out_at + LOOP_INTERVAL_S + TICK_LATE_S, (
        first_after - lock_runs_out_at
    )
    assert takeover_s <= FAILOVER_BOUND_S
    # No gap except around the kill: from the dead leader's last tick to the standby's first.
    missing = [
        prev + k for prev, nxt in itertools.pairwise(slots) for k in range(1, round(nxt - prev))
    ]
    gap_from = killed_at - LOOP_INTERVAL_S - TICK_LATE_S
    assert all(gap_from <= m < first_after for m in missing), (missing, killed_at, first_after)
    print(
        f"\nfailover: the dead leader's lock had {left_s:.2f} s left; the standby's first run "
        f"sent {takeover_s:.2f} s after the SIGKILL; {len(missing)} slot(s) not sent "
        f"({len(slots)} sent once each, none twice)"
    )


def test_plain_celery_beats_each_send_every_slot(beats: Any, client: redis.Redis) -> None:
    """The failure the platform's beat prevents: Celery's default scheduler has no lock."""
    key = uuid.uuid4().hex[:8]
    entries = {f"plain-{key}": {"task": "beat.record_slot", "every": 1, "args": [key]}}
    plain = ("-S", "celery.beat:PersistentScheduler")
    one, two = beats(entries, "plain-1", *plain), beats(entries, "plain-2", *plain)
    one.wait_log("beat: Starting...")
    two.wait_log("beat: Starting...")
    window_s = 6.0

    def twice_over_the_window() -> tuple[int, float] | None:
        """(runs, window in s) once the window is 6 s long and holds more runs than one
        beat can send."""
        stamps = sorted(enqueued(r) for r in runs(client, key))
        span = stamps[-1] - stamps[0] if stamps else 0.0
        # One beat sends at most one per second (span + 1 over the window); two send about
        # twice that. Measured on the senders' own stamps: a slow worker or test cannot
        # squeeze or stretch the window.
        return (len(stamps), span) if span >= window_s and len(stamps) > 1.5 * (span + 1) else None

    count, span = wait_for(
        twice_over_the_window,
        timeout_s=30,
        message=lambda: f"more than one run per slot (have {len(runs(client, key))})",
    )
    one.stop()
    two.stop()
    print(f"\nplain Celery, two beats: {count} runs of a 1 s entry in {span:.1f} s")


def test_after_downtime_at_most_catch_up_missed_slots_run(beats: Any, client: redis.Redis) -> None:
    key = uuid.uuid4().hex[:8]
    policies = {0: f"catch0-{key}", 1: f"catch1-{key}", 3: f"catch3-{key}"}
    entries = {
        entry: every_second(f"{key}-{n}", overlap="allow", catch_up=n)
        for n, entry in policies.items()
    }
    first = beats(entries, "before")
    wait_for(
        lambda: all(len(runs(client, f"{key}-{n}")) >= 2 for n in policies),
        timeout_s=30,
        message="two runs of each entry",
    )
    first.stop()
    stopped_at = time.time()
    down_s = 6.0
    time.sleep(down_s)  # beat is down for six intervals: the point of the test
    restarted_at = time.time()
    after = beats(entries, "after")
    wait_for(
        lambda: all(
            sum(1 for s in slot_times(runs(client, f"{key}-{n}")) if s > restarted_at + 1) >= 2
            for n in policies
        ),
        timeout_s=30,
        message="runs after the restart",
    )
    for catch_up, entry in policies.items():
        records = wait_consumed(client, f"{key}-{catch_up}", entry)
        slots = slot_times(records)
        assert len(slots) == len(set(slots))
        sent_at = {parse_slot(r["slot"]).timestamp(): enqueued(r) for r in records}
        last_before = max(s for s in slots if s <= stopped_at)
        # The first slot after the restart sent on time: the newest due one at the restarted
        # beat's first tick, as its log says (it decided), not guessed from how late it went
        # out (a tick that starts late on a loaded machine would move that guess).
        on_time = newest_due_at_restart(after.log(), entry)
        assert on_time in sent_at, (on_time, slots)
        assert sent_at[on_time] - on_time < LOOP_INTERVAL_S + TICK_LATE_S
        missed = round(on_time - last_before) - 1
        assert missed >= down_s - 1, (catch_up, missed)
        caught_up = [s for s in slots if last_before < s < on_time]
        assert len(caught_up) == min(catch_up, missed), (catch_up, caught_up)
        assert caught_up == [on_time - k for k in range(len(caught_up), 0, -1)]  # the newest
        assert all(sent_at[s] - s >= LOOP_INTERVAL_S for s in caught_up)  # sent late


#: What the scheduler logs when it drops slots missed while no beat ran (it names the newest
#: due slot, the one it sends on time).
MISSED_LOG = re.compile(
    r"beat entry '(?P<entry>[^']+)': (?:at least )?\d+ slot\(s\) between \S+ and "
    r"(?P<newest>\S+) missed while no beat ran"
)


def newest_due_at_restart(log: str, entry: str) -> float:
    found = [m["newest"] for m in MISSED_LOG.finditer(log) if m["entry"] == entry]
    assert len(found) == 1, f"one decision on the slots {entry} missed: {found}\n{log[-3000:]}"
    return parse_slot(found[0]).timestamp()


def test_a_run_longer_than_its_interval_makes_the_next_slots_skip(
    beats: Any, client: redis.Redis
) -> None:
    key = uuid.uuid4().hex[:8]
    entry = f"slow-{key}"
    # Default policy (overlap skip); the worker has two processes, so runs could overlap.
    entries = {entry: {"task": "beat.slow", "every": 1, "args": [key, 2.5]}}
    proc = beats(entries, "overlap")
    wait_for(lambda: len(runs(client, key)) >= 2, timeout_s=30, message="two slow runs")
    proc.stop()
    records = sorted(wait_consumed(client, key, entry), key=lambda r: r["started"])
    for earlier, later in itertools.pairwise(records):
        assert later["started"] >= earlier["ended"], "two runs of the entry overlapped"
    skipped = BeatState(client).skipped(entry, "overlap")
    assert skipped >= 2 * (len(records) - 1)  # each 2.5 s run held at least two 1 s slots
    assert "still queued or running" in proc.log()
