"""Payload versions across a deploy, on real workers, the real Redis and both databases.

Three apps declare the same task, ``versions.ship`` (tests/support/versions_*.py): version 1
``ship(key, address)``; version 2 ``ship(key, street, city)`` with ``upcast={1: ...}``; and
version 2's signature still declared version 1 (a change without a bump). A producer of one
release publishes, a worker of another runs.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from jobs_platform import history
from jobs_platform.deadletter.replay import replay, replay_rows
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, copies_in_broker
from tests.support.versions_common import ran

pytestmark = pytest.mark.acceptance

ADDRESS = "1 Main St, Springfield"


def worker(module: str, env: dict[str, str], tmp: Path, **extra_env: str) -> WorkerProcess:
    return WorkerProcess(
        f"tests.support.{module}",
        ["fast"],
        env={**env, **extra_env},
        cwd=str(ROOT),
        log_dir=str(tmp),
    )


def test_jobs_queued_by_version_1_run_on_version_2_workers_through_the_upcaster(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    from tests.support import versions_v1, versions_v2

    keys = [uuid.uuid4().hex for _ in range(5)]
    queued = [versions_v1.ship.delay(key, ADDRESS) for key in keys[:3]]
    # A delayed one too: it outlives the deploy in the delayed store.
    queued.append(versions_v1.ship.apply_async((keys[3], ADDRESS), countdown=2))
    queued.append(versions_v2.ship.delay(keys[4], "2 High St", "Shelbyville"))
    with worker("versions_v2", worker_env, tmp_path):
        for key in keys:
            wait_for(lambda key=key: ran(key), timeout_s=60, message=f"the run of {key}")
    for key in keys[:4]:
        [run] = ran(key)
        assert run["version"] == 2
        assert run["arguments"] == {"street": "1 Main St", "city": "Springfield"}
        assert run["retries"] == 0
    [run] = ran(keys[4])
    assert run["arguments"] == {"street": "2 High St", "city": "Shelbyville"}
    for result in queued:
        assert copies_in_broker(redis_client, result.id) == []


def test_a_version_2_job_waits_on_a_version_1_worker_and_runs_once_on_an_upgraded_one(
    worker_env: dict[str, str], tmp_path: Path, redis_client: redis.Redis
) -> None:
    from tests.support import versions_v1, versions_v2

    new_key, old_key = uuid.uuid4().hex, uuid.uuid4().hex
    # A window long enough that the job is still waiting when the upgraded worker starts; the
    # job looks again every tenth of it (12 s).
    with worker("versions_v1", worker_env, tmp_path, JOBS_VERSION_SKEW_WINDOW="120") as old:
        newer = versions_v2.ship.delay(new_key, "2 High St", "Shelbyville")
        wait_for(
            lambda: "is newer than this worker's version 1: deferred" in old.log(),
            timeout_s=30,
            message="the version-2 job deferred by the version-1 worker",
        )
        # The deferral held no pool slot (-c 1): a version-1 job runs meanwhile.
        versions_v1.ship.delay(old_key, ADDRESS)
        wait_for(lambda: ran(old_key), timeout_s=30, message="the version-1 job")
        assert ran(new_key) == []
    assert ran(new_key) == []  # never ran on the old code
    with worker("versions_v2", worker_env, tmp_path, JOBS_VERSION_SKEW_WINDOW="120"):
        [run] = wait_for(lambda: ran(new_key), timeout_s=60, message="the run on version 2")
        wait_for(lambda: newer.state == "SUCCESS", timeout_s=30, message=f"{newer.id} succeeded")
    assert run["version"] == 2
    assert run["task_id"] == newer.id
    assert run["retries"] == 0  # deferrals burn no attempt
    assert run["arguments"] == {"street": "2 High St", "city": "Shelbyville"}
    assert len(ran(new_key)) == 1
    assert copies_in_broker(redis_client, newer.id) == []


def test_past_the_skew_window_a_newer_job_is_dead_lettered_and_a_replay_runs_it(
    worker_env: dict[str, str], tmp_path: Path, module_pg_url: str
) -> None:
    from tests.support import versions_v2

    env = {**worker_env, "JOBS_DATABASE_URL": module_pg_url}
    store = DeadLetterStore(module_pg_url)
    key = uuid.uuid4().hex
    with worker("versions_v1", env, tmp_path, JOBS_VERSION_SKEW_WINDOW="3"):
        newer = versions_v2.ship.delay(key, "2 High St", "Shelbyville")
        [row] = wait_for(
            lambda: store.by_task_id(newer.id), timeout_s=60, message="the version_skew row"
        )
    assert row["reason"] == "version_skew"
    assert row["attempts"] == 1
    assert "payload of version 2 is newer than this worker's version 1" in row["error_message"]
    assert row["task_name"] == "versions.ship"
    assert row["headers"][history.VERSION_HEADER] == 2
    assert ran(key) == []
    # The deploy is done: a dry run on the new code says it fits; the replay runs it once.
    [dry] = list(
        replay_rows(
            versions_v2.app,
            store,
            [row["id"]],
            reason="deployed",
            actor="t",
            rate=100,
            dry_run=True,
        )
    )
    assert dry.outcome == "would_replay", dry
    with worker("versions_v2", env, tmp_path, JOBS_VERSION_SKEW_WINDOW="3"):
        new_id = replay(versions_v2.app, store, row["id"], reason="deployed", actor="t")
        [run] = wait_for(lambda: ran(key), timeout_s=60, message="the replayed run")
    assert run["task_id"] == new_id
    assert run["version"] == 2
    assert run["arguments"] == {"street": "2 High St", "city": "Shelbyville"}
    assert len(store.by_task_id(newer.id)) == 1
    assert store.get(row["id"])["status"] == "replayed"


def test_a_signature_changed_without_a_version_bump_is_one_version_skew_letter_per_job(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    from tests.support import versions_unbumped, versions_v1

    store = DeadLetterStore(worker_env["JOBS_DATABASE_URL"])  # SQLite
    keys = [uuid.uuid4().hex for _ in range(3)]
    sent = [versions_v1.ship.delay(key, ADDRESS) for key in keys]
    with worker("versions_unbumped", worker_env, tmp_path) as unbumped:
        rows = [
            wait_for(lambda r=r: store.by_task_id(r.id), timeout_s=60, message=f"{r.id}'s row")
            for r in sent
        ]
        for result in sent:
            wait_for(
                lambda result=result: result.state == "FAILURE",
                timeout_s=30,
                message=f"{result.id} failed",
            )
        log = unbumped.log()
    for [row] in rows:
        assert row["reason"] == "version_skew"
        assert row["attempts"] == 1  # not retried
        assert len(row["errors"]) == 1
        assert (
            "versions.ship: payload of version 1 does not fit the signature of version 1"
            in (row["error_message"])
        )
        assert "TypeError" in row["error_message"]
    for result in sent:
        assert len(store.by_task_id(result.id)) == 1
    for key in keys:
        assert ran(key) == []
    # The worker's alert line names the task and both versions.
    assert "gave up (version_skew)" in log
    assert "Retry in" not in log
    # A dry run reports the TypeError the replay would die of (the real replay refuses it).
    ids = [row["id"] for [row] in rows]
    outcomes = list(
        replay_rows(
            versions_unbumped.app, store, ids, reason="r", actor="t", rate=100, dry_run=True
        )
    )
    assert [o.outcome for o in outcomes] == ["refused"] * 3
    assert all("would fail" in str(o.why) and "TypeError" in str(o.why) for o in outcomes)
    cli = _dlq_replay_dry_run("tests.support.versions_unbumped", ids[0], worker_env)
    assert "TypeError" in cli, cli
    # On the version-2 code the same rows upcast and fit.
    from tests.support import versions_v2

    fine = list(
        replay_rows(versions_v2.app, store, ids, reason="r", actor="t", rate=100, dry_run=True)
    )
    assert [o.outcome for o in fine] == ["would_replay"] * 3


def _dlq_replay_dry_run(app: str, row_id: int, env: dict[str, str]) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            app,
            "dlq",
            "replay",
            str(row_id),
            "--dry-run",
            "--reason",
            "deploy",
        ],
        env={**env},
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout + done.stderr
