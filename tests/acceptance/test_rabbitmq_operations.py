"""RabbitMQ: connection loss, and the operations a team runs, with real workers in a vhost of
the module's own (coordination and results on the session's Redis database, idempotency keys
and dead letters in the module's PostgreSQL).

- **Connection loss** (``rabbitmqctl close_all_connections -p VHOST``, what a network cut, a
  load balancer or a node restart does): a late-acknowledged job running at that moment is
  cancelled by its worker (``worker_cancel_long_running_tasks_on_connection_loss``) and
  handed out again by the broker; it runs to completion, and a side effect behind an
  idempotency key happens once. The same side effect with no guard happens twice: "at least
  once, guarded side effects once". The Redis form of this test is the connection blip in
  test_broker_restart.py; a restart of the machine's RabbitMQ node is not done here.
- **Operations**: ``celery -A APP health`` (broker, consumers and the canary's round trip),
  the metrics exporter's queue depths, unique dispatch, a global rate limit. ``dlq replay``
  on RabbitMQ is in test_deadletter.py (``[rabbitmq]``); beat HA on RabbitMQ is not tested
  (beat's lock and slot records live on the coordination Redis, the same code as on Redis).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform import db
from jobs_platform.testing import WorkerProcess, wait_for
from jobs_platform.testing import rabbitmq as rabbitmq_testing
from tests.acceptance.conftest import ROOT, Broker, rabbitmq_env, runs

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(not rabbitmq_testing.available(), reason="RabbitMQ does not answer"),
]

APP = "tests.support.rabbitmq_ops_app"
#: How long a job keeps working after its side effect, unacknowledged: the cut comes then.
AFTER_EFFECT_S = 6.0


@pytest.fixture(scope="module")
def rmq(worker_env: dict[str, str], redis_url: str, module_pg_url: str) -> Iterator[Broker]:
    db.upgrade(module_pg_url)
    with rabbitmq_testing.rabbitmq_vhost() as url:
        env = {**rabbitmq_env(worker_env, url, redis_url), "JOBS_DATABASE_URL": module_pg_url}
        yield Broker("rabbitmq", env, redis_url, vhost=url.rsplit("/", 1)[1])


@pytest.fixture(scope="module")
def ops(rmq: Broker) -> Any:
    return rmq.load(APP)


@pytest.fixture(scope="module")
def worker(
    rmq: Broker, ops: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    with WorkerProcess(
        APP,
        ["fast"],
        env=rmq.env,
        cwd=str(ROOT),
        log_dir=str(tmp_path_factory.mktemp("rmqops")),
        concurrency=2,
        hostname=f"ops-{uuid.uuid4().hex[:6]}@rmq",
    ) as proc:
        yield proc


def effects(client: redis.Redis, job: str) -> list[str]:
    return list(client.lrange(f"jptest:effects:{job}", 0, -1))


def done(client: redis.Redis, job: str) -> list[str]:
    return list(client.lrange(f"jptest:done:{job}", 0, -1))


def test_a_connection_loss_sends_running_jobs_round_again_and_guarded_effects_stay_once(
    rmq: Broker, ops: Any, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    guarded, bare = f"guarded-{uuid.uuid4().hex[:6]}", f"bare-{uuid.uuid4().hex[:6]}"
    ops.effect.delay(guarded, AFTER_EFFECT_S)
    ops.unguarded.delay(bare, AFTER_EFFECT_S)
    wait_for(
        lambda: effects(redis_client, guarded) and effects(redis_client, bare),
        timeout_s=30,
        message="both side effects done, both jobs still running",
    )
    log_before = len(worker.log())
    cut = time.time()
    rmq.close_connections()
    wait_for(
        lambda: done(redis_client, guarded) and done(redis_client, bare),
        timeout_s=60,
        message=lambda: f"both jobs to finish again:\n{worker.log()[log_before:][-3000:]}",
    )
    guarded_runs, bare_runs = runs(redis_client, guarded), runs(redis_client, bare)
    seen = worker.log()[log_before:]
    lines = [
        line.strip()
        for line in seen.splitlines()
        if any(
            word in line
            for word in ("WARNING", "ERROR", "CRITICAL", "onnection", "Terminat", "WorkerLost")
        )
    ]
    print(
        f"\nconnection loss: guarded runs {len(guarded_runs)}, effects "
        f"{len(effects(redis_client, guarded))}; unguarded runs {len(bare_runs)}, effects "
        f"{len(effects(redis_client, bare))}; last runs began "
        f"{[round(r[-1]['t'] - cut, 1) for r in (guarded_runs, bare_runs)]} s after the cut"
        "\nwhat the worker logged:\n" + "\n".join(lines[:25])
    )
    # Each job ran again from the start, to completion, once more: at least once.
    assert len(guarded_runs) == 2 and len(bare_runs) == 2, (guarded_runs, bare_runs)
    assert len(done(redis_client, guarded)) == 1 and len(done(redis_client, bare)) == 1
    # Same job (task id) both times; the idempotency key kept its side effect to one.
    assert len({r["task_id"] for r in guarded_runs}) == 1
    assert len(effects(redis_client, guarded)) == 1
    assert len(effects(redis_client, bare)) == 2  # what the guard is for
    assert worker.alive


def test_a_wait_of_1_s_then_one_of_3_s_both_come_back(
    ops: Any, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    """Both waits expire in ``celery_delayed_0``. The retry used to copy the delivery's
    ``x-death`` record, and RabbitMQ drops a message dead-lettered again into a queue it
    already expired from (a dead-letter cycle): the job was gone, with no row and no log
    line (jobs_platform/brokers/rabbitmq/dispatch.py)."""
    key = f"waits-{uuid.uuid4().hex[:6]}"
    result = ops.waits.delay(key, [1.0, 3.0])
    assert result.get(timeout=40) == 3
    assert [r["retries"] for r in runs(redis_client, key)] == [0, 1, 2]


def test_health_passes_with_its_canary_and_the_exporter_reports_queue_depths(
    rmq: Broker, ops: Any, worker: WorkerProcess
) -> None:
    from jobs_platform.exporter.server import exposition

    checks = ("--check", "broker", "--check", "consumers", "--check", "canary", "--timeout", "20")
    done_ = subprocess.run(
        [sys.executable, "-m", "celery", "-A", APP, "health", "--json", "-Q", "fast", *checks],
        env=rmq.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done_.returncode == 0, done_.stdout + done_.stderr
    report = {c["name"]: c for c in json.loads(done_.stdout)["checks"]}
    assert sorted(report) == ["broker", "canary:fast", "consumers:fast"], report
    assert report["consumers:fast"]["detail"] == f"consumed by {worker.hostname}"
    assert report["canary:fast"]["detail"].startswith("round trip "), report

    for n in range(3):  # heavy: no worker here consumes it
        ops.parked.delay(n)
    text = wait_for(
        lambda: (
            t
            if 'celery_queue_length{queue_name="heavy"} 3.0' in (t := exposition(ops.app))
            else None
        ),
        timeout_s=15,
        message=lambda: "heavy's depth 3 in:\n" + exposition(ops.app),
    )
    assert 'celery_queue_length{queue_name="fast"} 0.0' in text
    # What RabbitMQ cannot tell over AMQP (docs: brokers/rabbitmq/__init__.py).
    age = [line for line in text.splitlines() if line.startswith("jobs_queue_oldest_age")]
    inflight = [line for line in text.splitlines() if line.startswith("jobs_inflight{")]
    print(f"\nexporter on RabbitMQ: oldest age {age or 'not reported'}; in flight {inflight}")


def test_unique_dispatch_refuses_a_duplicate(
    ops: Any, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    key, order = uuid.uuid4().hex, int(uuid.uuid4().int % 10**9)
    first = ops.charge.delay(order, key)
    second = ops.charge.delay(order, key)
    assert second.id == first.id  # the same job, not a second one
    first.get(timeout=30)
    assert len(runs(redis_client, key)) == 1


def test_a_global_rate_limit_spaces_the_starts(
    ops: Any, worker: WorkerProcess, redis_client: redis.Redis
) -> None:
    key = f"rate-{uuid.uuid4().hex[:6]}"
    ops.limited.delay_many([(key,)] * 8)
    records = wait_for(
        lambda: r if len(r := runs(redis_client, key)) >= 8 else None,
        timeout_s=60,
        message=lambda: f"8 starts (have {len(runs(redis_client, key))})",
    )
    starts = sorted(r["t"] for r in records)
    busiest = max(sum(1 for t in starts if first <= t < first + 1.0) for first in starts)
    print(
        f"\n8 jobs at 4/s on RabbitMQ: first to last start {starts[-1] - starts[0]:.1f} s, "
        f"at most {busiest} starts in a 1-s window; retries "
        f"{sorted({r['retries'] for r in records})}"
    )
    assert len(records) == 8
    assert busiest <= 4 + 1  # the bucket's burst, plus one at a window's edge
