"""The exporter's ``batches`` source on a real Redis broker and the real PostgreSQL and SQLite:
batches made by ``batch()`` (members published to Redis) are served as open with their
pending members (``jobs_batches_open``, ``jobs_batch_members_pending``) until their members
settle as the workers record them, then 0; and the maintenance task prunes settled batches
past ``JOBS_BATCH_RETENTION`` through the setting, keeping running ones however old."""

from __future__ import annotations

import datetime as dt
import gc
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from prometheus_client import CollectorRegistry, generate_latest

from jobs_platform import ReliableTask, batch, create_app
from jobs_platform.batches import counting
from jobs_platform.batches.model import batches, members
from jobs_platform.db import engine_for, upgrade
from jobs_platform.exporter.collector import JobsCollector
from jobs_platform.exporter.sources import Sources
from jobs_platform.outbox.model import job_outbox
from jobs_platform.schedule import maintenance
from tests.support.metrics_app import samples, value

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    with engine_for(url).begin() as conn:
        for table in (job_outbox, members, batches):
            conn.execute(sa.delete(table))
    return url


@pytest.fixture()
def app(redis_url: str, db_url: str) -> Iterator[Any]:
    redis.Redis.from_url(redis_url).delete("fast")
    app = create_app(
        "batchmetrics", broker_url=redis_url, database_url=db_url, batch_retention=3600.0
    )

    @app.task(base=ReliableTask, name="bm.member", queue="fast")
    def member(n: int) -> None: ...

    yield app
    redis.Redis.from_url(redis_url).delete("fast")
    gc.collect()  # AsyncResults unsubscribe from the result store when collected


def scrape(app: Any) -> dict[Any, float]:
    registry = CollectorRegistry()
    registry.register(JobsCollector(Sources.from_app(app)))
    return samples(generate_latest(registry).decode())


def settle(url: str, batch_id: str, member_ids: list[str], outcome: str) -> None:
    for member_id in member_ids:
        with engine_for(url).begin() as conn:
            assert counting.record(conn, batch_id, member_id, outcome) is not None


def test_open_batches_and_their_pending_members_are_served_until_they_settle(
    app: Any, redis_url: str, db_url: str
) -> None:
    member = app.tasks["bm.member"]
    got = scrape(app)
    assert value(got, "jobs_exporter_source_up", source="batches") == 1
    assert value(got, "jobs_batches_open") == 0  # served at 0, not missing
    assert value(got, "jobs_batch_members_pending") == 0

    first = batch("first", [member.s(n) for n in range(5)])
    second = batch("second", [member.s(n) for n in range(3)])
    assert redis.Redis.from_url(redis_url).llen("fast") == 8  # really published
    got = scrape(app)
    assert value(got, "jobs_batches_open") == 2
    assert value(got, "jobs_batch_members_pending") == 8

    ids = [r.id for r in first.results]
    settle(db_url, first.id, ids[:4], "succeeded")
    got = scrape(app)
    assert (value(got, "jobs_batches_open"), value(got, "jobs_batch_members_pending")) == (2, 4)

    settle(db_url, first.id, ids[4:], "dead")  # settled: failed, no longer open
    second.cancel("test")  # cancelled but its members still pending: still open
    got = scrape(app)
    assert (value(got, "jobs_batches_open"), value(got, "jobs_batch_members_pending")) == (1, 3)

    settle(db_url, second.id, [r.id for r in second.results], "cancelled")
    got = scrape(app)
    assert (value(got, "jobs_batches_open"), value(got, "jobs_batch_members_pending")) == (0, 0)
    assert value(got, "jobs_exporter_source_up", source="batches") == 1


def test_retention_prunes_settled_batches_past_the_setting_and_keeps_running_ones(
    app: Any, db_url: str
) -> None:
    now = dt.datetime.now(dt.UTC)
    ago = {"old": now - dt.timedelta(hours=2), "recent": now - dt.timedelta(minutes=10)}
    engine = engine_for(db_url)
    for name, created, outcome in [
        ("old succeeded", ago["old"], "succeeded"),
        ("old failed", ago["old"], "dead"),
        ("old cancelled", ago["old"], "cancelled"),
        ("recent succeeded", ago["recent"], "succeeded"),
        ("old running", now - dt.timedelta(days=30), None),
    ]:
        batch_id = name.replace(" ", "-")
        with engine.begin() as conn:
            counting.create(conn, batch_id, name, 2, {}, now=created)
            counting.record(conn, batch_id, "m1", "succeeded", now=created)
            if outcome is not None:
                counting.record(conn, batch_id, "m2", outcome, now=created)

    done = app.tasks[maintenance.PRUNE_BATCHES].run()  # the body, on the real database

    assert done == {"deleted": 3}
    with engine.connect() as conn:
        kept = sorted(conn.execute(sa.select(batches.c.id)).scalars())
        kept_members = sorted(conn.execute(sa.select(members.c.batch_id)).scalars())
    assert kept == ["old-running", "recent-succeeded"]
    assert kept_members == ["old-running", "recent-succeeded", "recent-succeeded"]
    assert app.tasks[maintenance.PRUNE_BATCHES].run() == {"deleted": 0}
