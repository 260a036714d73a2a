"""The outbox relay publishing to a real Redis: the message is the one ``.delay()`` sends,
with the id the call returned, and two relays racing over 10,000 committed rows put each
job on its queue once (PostgreSQL: SKIP LOCKED; SQLite: one writer)."""

from __future__ import annotations

import base64
import gc
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy.orm import Session

from jobs_platform import ReliableTask, create_app
from jobs_platform.brokers.redis import delayed
from jobs_platform.brokers.redis import options as delayed_options
from jobs_platform.db import engine_for, upgrade
from jobs_platform.exporter.collector import JobsCollector
from jobs_platform.exporter.sources import Sources
from jobs_platform.history import ENQUEUED_HEADER
from jobs_platform.outbox.model import job_outbox
from jobs_platform.outbox.relay import relay_once
from jobs_platform.testing import RedisServer
from tests.support.metrics_app import samples, value

pytestmark = pytest.mark.integration

ROWS = 10_000
#: Fields each message has of its own; everything else must be identical.
OWN_HEADERS = {"id", "root_id", "argsrepr", "kwargsrepr", "eta", ENQUEUED_HEADER}
OWN_PROPERTIES = {"correlation_id", "delivery_tag"}


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:  # queue lists are read raw: a Redis of our own
        yield srv


@pytest.fixture()
def client(server: RedisServer) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(server.url)
    c.flushdb()
    yield c
    c.close()


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        url: str = request.getfixturevalue("pg_url")
    else:
        url = f"sqlite:///{tmp_path}/jobs.sqlite3"
    upgrade(url)
    with engine_for(url).begin() as conn:
        conn.execute(sa.delete(job_outbox))
    return url


@pytest.fixture()
def app(server: RedisServer, client: redis.Redis, db_url: str) -> Iterator[Any]:
    app = create_app("outboxrelay", broker_url=server.url, database_url=db_url)

    @app.task(base=ReliableTask, bind=True, queue="thirdparty", name="shop.charge")
    def charge(self: Any, order_id: int, note: str = "") -> None: ...

    yield app
    gc.collect()  # AsyncResults unsubscribe from the result store when collected


def queued(client: redis.Redis, queue: str = "thirdparty") -> list[dict[str, Any]]:
    return [json.loads(item) for item in reversed(client.lrange(queue, 0, -1))]


def test_the_relay_sends_what_delay_sends(app: Any, client: redis.Redis) -> None:
    charge = app.tasks["shop.charge"]
    charge.apply_async((1,), {"note": "x"}, priority=None)
    with Session(engine_for(app.jobs_settings.database_url)) as session:
        result = charge.delay_on_commit(session, 1, note="x")
        session.commit()
    assert relay_once(app) == 1
    direct, relayed = queued(client)
    assert relayed["headers"]["id"] == result.id
    for message in (direct, relayed):
        for name in OWN_HEADERS:
            message["headers"].pop(name, None)
        for name in OWN_PROPERTIES:
            message["properties"].pop(name, None)
    assert relayed == direct
    assert relay_once(app) == 0  # published once


def test_a_countdown_goes_to_the_delayed_store_with_its_eta(app: Any, client: redis.Redis) -> None:
    before_ms = time.time() * 1000
    with Session(engine_for(app.jobs_settings.database_url)) as session:
        result = app.tasks["shop.charge"].apply_async_on_commit(session, (2,), countdown=3600)
        session.commit()
    assert relay_once(app) == 1
    assert client.llen("thirdparty") == 0  # not on the queue: waiting for its time
    job = delayed.get(client, delayed_options.keys_for(app), result.id)
    assert job is not None and job.queue == "thirdparty"
    # Due an hour after the call (the relay ran within seconds of it).
    assert before_ms + 3599_000 <= job.due <= before_ms + 3660_000


def test_two_relays_racing_over_10000_rows_queue_each_job_once(
    app: Any, client: redis.Redis, db_url: str
) -> None:
    charge = app.tasks["shop.charge"]
    with Session(engine_for(db_url)) as session:
        ids = [charge.delay_on_commit(session, n).id for n in range(ROWS)]
        session.commit()
    counts = [0, 0]
    barrier = threading.Barrier(2)

    def relay(i: int) -> None:
        # An engine each, as two worker processes would have.
        engine = sa.create_engine(
            db_url, connect_args={"timeout": 30} if "sqlite" in db_url else {}
        )
        barrier.wait()
        while sent := relay_once(app, limit=500, engine=engine):
            counts[i] += sent
        engine.dispose()

    threads = [threading.Thread(target=relay, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert sum(counts) == ROWS
    messages = queued(client)
    assert len(messages) == ROWS
    assert sorted(m["headers"]["id"] for m in messages) == sorted(ids)  # each once
    order_ids = sorted(json.loads(base64.b64decode(m["body"]))[0][0] for m in messages)
    assert order_ids == list(range(ROWS))


def test_the_exporter_serves_the_outbox_backlog(app: Any) -> None:
    with Session(engine_for(app.jobs_settings.database_url)) as session:
        for n in range(3):
            app.tasks["shop.charge"].delay_on_commit(session, n)
        session.commit()

    def scrape(now: float) -> dict[Any, float]:
        registry = CollectorRegistry()
        registry.register(JobsCollector(Sources.from_app(app), clock=lambda: now))
        return samples(generate_latest(registry).decode())

    later = time.time() + 30
    got = scrape(later)
    assert value(got, "jobs_exporter_source_up", source="outbox") == 1
    assert value(got, "jobs_outbox_depth") == 3
    assert 29 <= value(got, "jobs_outbox_oldest_age_seconds") <= 90
    assert relay_once(app) == 3
    got = scrape(later)
    assert value(got, "jobs_outbox_depth") == 0
    assert value(got, "jobs_outbox_oldest_age_seconds") == 0
