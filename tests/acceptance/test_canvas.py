"""Celery's canvas inside the dead-letter promise, on real workers and PostgreSQL.

A chord of 200 chunks with 2 that die: the callback that cannot run is a dead letter
(``upstream_failed``, once, with its group and the culprit), the chunks' letters link to the
group and the callback, and replaying the fixed chunks runs them but never the callback.
A chain whose middle step dies: the step after it is an ``upstream_failed`` letter too.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import chain, chord

from jobs_platform.deadletter import replay as dlq_replay
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.testing import WorkerProcess, wait_for
from tests.acceptance.conftest import ROOT, wait_state

pytestmark = pytest.mark.acceptance

CHUNKS = 200
POISON = (17, 123)


@pytest.fixture(scope="module")
def canvas(worker_env: dict[str, str]) -> Any:
    from tests.support import canvas_app

    return canvas_app


@pytest.fixture(scope="module")
def store(module_pg_url: str) -> DeadLetterStore:
    return DeadLetterStore(module_pg_url)


@pytest.fixture(scope="module")
def worker(
    worker_env: dict[str, str], module_pg_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with WorkerProcess(
        "tests.support.canvas_app",
        ["fast"],
        env={**worker_env, "JOBS_DATABASE_URL": module_pg_url},
        cwd=str(ROOT),
        log_dir=str(tmp_path_factory.mktemp("canvas")),
        hostname=f"canvas-{uuid.uuid4().hex[:6]}@canvas",
        concurrency=2,
    ) as proc:
        yield proc


def chunk_runs(client: redis.Redis, key: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in client.hgetall(f"jptest:chunkruns:{key}").items()}


def test_a_chord_whose_chunks_die_dead_letters_its_callback_once_and_replay_never_runs_it(
    canvas: Any,
    worker: WorkerProcess,
    store: DeadLetterStore,
    redis_client: redis.Redis,
) -> None:
    # Measured (printed with -s, for docs/canvas.md): a clean chord of 200 first.
    clean = uuid.uuid4().hex
    began = time.monotonic()
    ok = chord(canvas.chunk.s(clean, i) for i in range(CHUNKS))(canvas.total.s(clean))
    assert ok.get(timeout=120) == sum(range(CHUNKS))
    print(f"\nclean chord of {CHUNKS}: {time.monotonic() - began:.2f} s")

    key = uuid.uuid4().hex
    redis_client.sadd(f"jptest:poison:{key}", *POISON)
    began = time.monotonic()
    result = chord(canvas.chunk.s(key, i) for i in range(CHUNKS))(canvas.total.s(key))
    assert wait_state(result, {"FAILURE", "SUCCESS"}, timeout_s=120) == "FAILURE"
    print(
        f"chord of {CHUNKS} with {len(POISON)} dead chunks to FAILURE: "
        f"{time.monotonic() - began:.2f} s ({type(result.result).__name__})"
    )
    assert type(result.result).__name__ == "ChordError"
    group_id = result.parent.id

    # The callback that cannot run: one dead letter, upstream_failed, with its links.
    [letter] = wait_for(lambda: store.by_task_id(result.id), timeout_s=30, message="callback")
    assert letter["reason"] == "upstream_failed"
    assert letter["task_name"] == "canvas.total" and letter["kwargs"] == {}
    assert letter["args"] == [key]
    assert letter["error_type"] == "celery.exceptions.ChordError"
    links = letter["headers"]["jobs_canvas"]
    assert links["group"] == group_id
    assert links["chord_callback"] == {"id": result.id, "task": "canvas.total"}
    # Celery logs it once too.
    assert worker.log().count(f"Chord '{group_id}' raised") == 1

    # The dead chunks: their letters link to the group and the callback.
    chunk_ids = {child.id: index for index, child in enumerate(result.parent.results)}
    dead = {
        index: wait_for(lambda t=task_id: store.by_task_id(t), timeout_s=30, message="chunk")
        for task_id, index in chunk_ids.items()
        if index in POISON
    }
    for index, [row] in dead.items():
        assert row["reason"] == "permanent" and row["args"] == [key, index]
        assert row["headers"]["jobs_canvas"]["group"] == group_id
        assert row["headers"]["jobs_canvas"]["chord_callback"]["id"] == result.id

    # The callback's letter cannot be replayed: its input never existed.
    with pytest.raises(dlq_replay.ReplayRefused, match="never ran"):
        dlq_replay.replay(canvas.app, store, letter["id"], reason="x", actor="test")

    # Fixed: the chunks replay and run, the callback never does.
    redis_client.delete(f"jptest:poison:{key}")
    replayed = [
        dlq_replay.replay(canvas.app, store, row["id"], reason="fixed", actor="test")
        for [row] in dead.values()
    ]
    for task_id in replayed:
        assert canvas.app.AsyncResult(task_id).get(timeout=60) in POISON
    assert {i: n for i, n in chunk_runs(redis_client, key).items() if n > 1} == {
        17: 2,
        123: 2,
    }
    assert redis_client.get(f"jptest:callback:{key}") is None  # never ran
    assert result.state == "FAILURE"


def test_a_chain_whose_step_dies_dead_letters_the_step_after_it_with_the_remainder(
    canvas: Any,
    worker: WorkerProcess,
    store: DeadLetterStore,
    redis_client: redis.Redis,
) -> None:
    key = uuid.uuid4().hex
    redis_client.sadd(f"jptest:poison:{key}", 2)
    flow = chain(canvas.step.s(1, key), canvas.step.s(key), canvas.step.s(key), canvas.step.s(key))
    last = flow.apply_async()
    third = last.parent
    second = third.parent
    [died] = wait_for(lambda: store.by_task_id(second.id), timeout_s=60, message="step 2")
    assert died["reason"] == "permanent"
    assert died["headers"]["jobs_canvas"]["chain_remainder"] == [
        {"id": third.id, "task": "canvas.step"},
        {"id": last.id, "task": "canvas.step"},
    ]
    [next_step] = wait_for(lambda: store.by_task_id(third.id), timeout_s=30, message="step 3")
    assert next_step["reason"] == "upstream_failed"
    assert next_step["args"] == [key]
    links = next_step["headers"]["jobs_canvas"]
    assert links["upstream"] == second.id
    assert links["chain_remainder"] == [{"id": last.id, "task": "canvas.step"}]
    assert "died" in next_step["error_message"]
    assert store.by_task_id(last.id) == []  # one letter for the step that cannot run
    assert int(redis_client.get(f"jptest:steps:{key}") or 0) == 2
