"""A worker's connection loss, on a real Redis: the channel and the running jobs.

After a broker outage Celery collects the dead kombu connection, which detaches it from its
transport, and then closes it; jobs fetched before the outage are acknowledged afterwards.
With kombu 5.7 alone both raise ``AttributeError`` out of the consumer ("Unrecoverable
error": the worker exits) (jobs_platform.brokers.redis.reconnect).

Celery also cancels the jobs running at that moment; their messages must stay
unacknowledged so that they are delivered again (jobs_platform.deadletter.hooks). Those
tests drive the worker's request object by hand on a real message, with a stand-in pool.
The cancel's SIGTERM must not cost the dead letter a pool process is storing either.
"""

from __future__ import annotations

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
from billiard.einfo import ExceptionInfo
from billiard.exceptions import Terminated
from kombu import Connection, Exchange, Producer, Queue

from jobs_platform import ReliableTask, create_app
from jobs_platform.brokers.redis.transport import Transport
from jobs_platform.deadletter.hooks import DeadLetterRequest
from jobs_platform.testing import RedisServer

pytestmark = pytest.mark.integration

FAST = Queue("fast", Exchange("fast", type="direct"), routing_key="fast")


@pytest.fixture()
def server() -> Iterator[RedisServer]:
    with RedisServer(persistent=True) as private:
        yield private


def test_a_detached_channel_closes_and_acknowledges_without_raising(server: RedisServer) -> None:
    raw = redis.Redis.from_url(server.url)
    conn = Connection(server.url, transport=Transport)
    channel = conn.default_channel  # as Celery's consumer
    FAST(channel).declare()
    for n in (1, 2):
        Producer(channel).publish({"n": n}, exchange=FAST.exchange, routing_key="fast")
    first, second = channel.basic_get("fast"), channel.basic_get("fast")
    assert first is not None and second is not None
    assert raw.hlen("unacked") == 2

    server.stop()  # the broker goes away (its data survives: AOF)
    channel.connection.client = None  # Celery's collect() detaches the transport
    channel.close()  # the restore at close gives way instead of raising AttributeError
    server.start()
    assert raw.hlen("unacked") == 2  # both kept for the visibility-timeout sweep

    first.ack()  # a job that finished after the outage: acknowledged for real
    assert raw.hlen("unacked") == 1 and raw.zcard("unacked_index") == 1
    second.reject(requeue=True)  # given back: kept for the sweep, not dropped
    assert raw.hlen("unacked") == 1 and raw.llen("fast") == 0
    raw.close()
    conn.release()


# -- a running job cancelled because the connection was lost (jobs_platform.deadletter.hooks)


class Pool:
    """Stands in for the worker's pool: records the kill Celery asks of it."""

    def __init__(self, *, green: bool) -> None:
        self.is_green = green
        self.killed: list[tuple[int, int]] = []

    def terminate_job(self, pid: int, signal: int | None = None) -> None:
        self.killed.append((pid, int(signal or 0)))


@pytest.fixture()
def cancel_setup(
    server: RedisServer, tmp_path: Path
) -> Iterator[tuple[Any, RedisServer, Any, redis.Redis]]:
    """An app on the real broker whose result backend is a second private Redis (to stop),
    a channel as the consumer's, and a client on the broker."""
    with RedisServer(persistent=True) as backend:
        app = create_app(
            "cancelapp",
            broker_url=server.url,
            result_backend=backend.url,
            database_url=f"sqlite:///{tmp_path / 'jobs.sqlite3'}",
            dispatch_timeout=0.4,  # a backend write to a dead Redis gives up within 0.2 s
        )

        @app.task(base=ReliableTask, name="cancel.job", queue="fast")
        def job() -> None:
            """Never runs here: only its requests are handled."""

        conn = Connection(server.url, transport=Transport)
        channel = conn.default_channel
        FAST(channel).declare()
        raw = redis.Redis.from_url(server.url)
        yield app, backend, channel, raw
        raw.close()
        conn.release()


def fetched_request(app: Any, channel: Any) -> Any:
    """A DeadLetterRequest for a task message published and fetched on ``channel``."""
    message = app.amqp.as_task_v2(uuid.uuid4().hex, "cancel.job", args=(), kwargs={})
    Producer(channel).publish(
        message.body,
        exchange=FAST.exchange,
        routing_key="fast",
        headers=message.headers,
        serializer="json",
        **message.properties,
    )
    fetched = channel.basic_get("fast")
    assert fetched is not None
    return DeadLetterRequest(
        fetched,
        on_ack=fetched.ack_log_error,
        on_reject=fetched.reject_log_error,
        app=app,
        task=app.tasks["cancel.job"],
    )


def terminated() -> ExceptionInfo:
    try:
        raise Terminated(-15)
    except Terminated:
        return ExceptionInfo()


def test_a_job_cancelled_while_the_backend_is_down_is_not_acknowledged(
    cancel_setup: tuple[Any, RedisServer, Any, redis.Redis],
) -> None:
    """Celery writes a RETRY state before it marks the request cancelled: with the result
    backend down that raised, and the child's death was then taken for a revoke, which
    acknowledged the message (the backend back by then): the job was lost."""
    app, backend, channel, raw = cancel_setup
    request = fetched_request(app, channel)
    request.on_accepted(4242, time.monotonic())  # running in a pool process
    pool = Pool(green=False)

    backend.stop()
    request.cancel(pool)  # the connection-loss cancel: tolerates the failed RETRY write
    backend.start()
    request.on_failure(terminated())  # the killed child reports

    assert pool.killed == [(4242, 15)]
    assert raw.hlen("unacked") == 1  # kept: redelivered after the visibility timeout


def test_a_job_cancelled_before_it_started_is_not_acknowledged(
    cancel_setup: tuple[Any, RedisServer, Any, redis.Redis],
) -> None:
    """Not yet accepted by a pool process: the pool ends it as terminated, unannounced."""
    app, _, channel, raw = cancel_setup
    request = fetched_request(app, channel)
    pool = Pool(green=False)

    request.cancel(pool)
    request.on_failure(terminated())

    assert pool.killed == []
    assert raw.hlen("unacked") == 1


def test_a_greenlet_killed_by_the_cancel_is_not_acknowledged_as_a_success(
    cancel_setup: tuple[Any, RedisServer, Any, redis.Redis],
) -> None:
    """gevent: the killed greenlet returns Celery's "killed" result, (False, None, None),
    which the request took for a success and acknowledged."""
    app, _, channel, raw = cancel_setup
    request = fetched_request(app, channel)
    request.on_accepted(7, time.monotonic())
    pool = Pool(green=True)

    request.cancel(pool)
    request.on_success((False, None, None))

    assert pool.killed == [(7, 15)]
    assert raw.hlen("unacked") == 1

    # A job that was not cancelled is acknowledged when it succeeds, as ever.
    other = fetched_request(app, channel)
    other.on_accepted(8, time.monotonic())
    other.on_success((False, None, 0.01))
    assert raw.hlen("unacked") == 1


# -- a SIGTERM while a pool process stores a dead letter (hooks.terminate_after) ------------

#: A pool process (``worker_process_init`` sent) whose job failed for good while the broker
#: is down (the spool unreachable): SIGTERM arrives during the dead letter's database write,
#: as the connection-loss cancel's does. argv: database URL, dead broker URL, task id.
POOL_PROCESS = """
import os, signal, sys
from billiard.common import reset_signals
from celery import signals
from jobs_platform import create_app
from jobs_platform.deadletter import hooks, store
from jobs_platform.testing import dead_letter

app = create_app("sigterm", database_url=sys.argv[1], broker_url=sys.argv[2])
reset_signals()  # billiard's handlers, as in a pool process: SIGTERM raises SystemExit
signals.worker_process_init.send(sender=None)
add = store.DeadLetterStore.add

def add_under_sigterm(self, letter):
    os.kill(os.getpid(), signal.SIGTERM)  # lands inside the write
    return add(self, letter)

store.DeadLetterStore.add = add_under_sigterm
letter = dead_letter(reason="exhausted", task_id=sys.argv[3], error_type="E", message="m")
hooks.capture(app, lambda: letter)
print("survived the SIGTERM")
"""


def test_a_sigterm_during_a_dead_letter_write_stops_the_process_after_it(
    module_pg_url: str,
) -> None:
    from jobs_platform import db
    from jobs_platform.deadletter.store import DeadLetterStore
    from jobs_platform.testing import free_port

    db.upgrade(module_pg_url)
    task_id = f"sigterm-{uuid.uuid4()}"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            POOL_PROCESS,
            module_pg_url,
            f"redis://127.0.0.1:{free_port()}/0",
            task_id,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    store = DeadLetterStore(module_pg_url)
    try:
        assert store.by_task_id(task_id), done.stdout + done.stderr  # stored, then ...
    finally:
        store.engine.dispose()
    assert "survived" not in done.stdout  # ... the signal took effect
    # billiard's handler exits with sys.exit(-(256 - signum)): status 15
    assert done.returncode == signal.SIGTERM, done.stdout + done.stderr
