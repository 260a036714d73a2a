"""delay_on_commit on the real databases: the row lives and dies with the caller's
transaction, and relays racing over the table claim each row once (PostgreSQL: SKIP
LOCKED; SQLite: one writer). The relays here record what they would publish (no broker
in this tier); tests/integration/redis/test_outbox_relay.py publishes for real."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from kombu.utils.json import loads
from sqlalchemy.orm import Session

from jobs_platform import DispatchError, ReliableTask, create_app
from jobs_platform.db import engine_for, upgrade
from jobs_platform.outbox.model import job_outbox
from jobs_platform.outbox.relay import Row, relay_once
from jobs_platform.outbox.upkeep import backlog, prune
from tests.support.guards import NO_BROKER

pytestmark = pytest.mark.integration

ROWS = 10_000


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("pg_url" if request.param == "postgresql" else "sqlite_url")
    upgrade(url)
    with engine_for(url).begin() as conn:
        conn.execute(sa.delete(job_outbox))  # pg_url is the session's: start empty
    return url


@pytest.fixture()
def app(db_url: str) -> Any:
    app = create_app("outboxtest", broker_url=NO_BROKER, database_url=db_url)

    @app.task(base=ReliableTask, bind=True, queue="thirdparty", name="shop.charge")
    def charge(self: Any, order_id: int, amount: Decimal | None = None) -> None: ...

    return app


@pytest.fixture()
def session(db_url: str) -> Iterator[Session]:
    with Session(engine_for(db_url)) as session:
        yield session


def rows(url: str) -> list[Any]:
    with engine_for(url).connect() as conn:
        return list(conn.execute(sa.select(job_outbox).order_by(job_outbox.c.id)))


def test_a_commit_writes_the_job_with_the_returned_id(app: Any, session: Session) -> None:
    charge = app.tasks["shop.charge"]
    result = charge.delay_on_commit(session, 7, amount=Decimal("9.99"))
    assert rows(app.jobs_settings.database_url) == []  # not committed: nobody sees it
    session.commit()
    [row] = rows(app.jobs_settings.database_url)
    assert row.task_id == result.id and row.task_name == "shop.charge"
    assert loads(row.payload) == [[7], {"amount": Decimal("9.99")}]  # typed, as .delay()
    assert loads(row.options) == {"headers": {"jobs_version": 1}}  # the payload version
    assert row.published_at is None


def test_a_rollback_leaves_no_job(app: Any, session: Session) -> None:
    app.tasks["shop.charge"].delay_on_commit(session, 7)
    session.rollback()
    session.commit()
    assert rows(app.jobs_settings.database_url) == []


def test_a_rolled_back_savepoint_drops_its_jobs_only(app: Any, session: Session) -> None:
    charge = app.tasks["shop.charge"]
    kept = charge.delay_on_commit(session, 1)
    with session.begin_nested():
        released = charge.delay_on_commit(session, 2)  # the savepoint is released: kept
    nested = session.begin_nested()
    charge.delay_on_commit(session, 3)
    nested.rollback()
    session.commit()
    assert [r.task_id for r in rows(app.jobs_settings.database_url)] == [kept.id, released.id]


def test_options_are_checked_and_kept(app: Any, session: Session) -> None:
    charge = app.tasks["shop.charge"]
    before = dt.datetime.now(dt.UTC)
    result = charge.apply_async_on_commit(
        session, (5,), {}, queue="heavy", priority=3, countdown=60, task_id="given-id"
    )
    session.commit()
    assert result.id == "given-id"
    [row] = rows(app.jobs_settings.database_url)
    options = loads(row.options)
    assert options["queue"] == "heavy" and options["priority"] == 3
    eta = dt.datetime.fromisoformat(options["eta"])  # counted from the call, not the relay
    assert before + dt.timedelta(seconds=59) <= eta <= before + dt.timedelta(seconds=120)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda t, s: t.apply_async_on_commit(s, (1,), queue="fsat"), "fsat"),
        (lambda t, s: t.apply_async_on_commit(s, (1,), countdown=10**9), "JOBS_MAX_DELAY"),
        (lambda t, s: t.delay_on_commit(s, {1, 2}), "set"),
        (lambda t, s: t.apply_async_on_commit(s, (1,), link=None), "link"),
    ],
)
def test_what_delay_refuses_is_refused_at_the_call(
    app: Any, session: Session, call: Any, words: str
) -> None:
    with pytest.raises(DispatchError, match=words):
        call(app.tasks["shop.charge"], session)
    session.commit()
    assert rows(app.jobs_settings.database_url) == []


def test_wrong_arguments_fail_at_the_call_as_with_delay(app: Any, session: Session) -> None:
    with pytest.raises(TypeError, match="positional arguments"):
        app.tasks["shop.charge"].delay_on_commit(session, 1, 2, 3)
    session.commit()
    assert rows(app.jobs_settings.database_url) == []


def test_a_session_on_another_database_is_refused(app: Any, tmp_path: Any) -> None:
    other = sa.create_engine(f"sqlite:///{tmp_path}/app.sqlite3")
    with Session(other) as session, pytest.raises(DispatchError, match="not on the platform"):
        app.tasks["shop.charge"].delay_on_commit(session, 1)
    with Session() as unbound, pytest.raises(DispatchError, match="Session bound"):
        app.tasks["shop.charge"].delay_on_commit(unbound, 1)


def commit_rows(app: Any, count: int) -> list[str]:
    charge = app.tasks["shop.charge"]
    with Session(engine_for(app.jobs_settings.database_url)) as session:
        ids = [charge.delay_on_commit(session, n).id for n in range(count)]
        session.commit()
    return ids


def test_two_relays_racing_publish_each_row_once(app: Any) -> None:
    ids = commit_rows(app, ROWS)
    url = app.jobs_settings.database_url
    sent: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def relay(i: int) -> None:
        # Each relay has its own engine, as two worker processes would.
        engine = sa.create_engine(url, connect_args={"timeout": 30} if "sqlite" in url else {})
        barrier.wait()
        while relay_once(app, limit=500, engine=engine, send=lambda _a, r: record(i, r)):
            pass
        engine.dispose()

    def record(i: int, claimed: Sequence[Row]) -> None:
        sent[i].extend(row.task_id for row in claimed)

    threads = [threading.Thread(target=relay, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    everything = sent[0] + sent[1]
    assert len(everything) == ROWS and set(everything) == set(ids)  # each exactly once
    assert all(r.published_at is not None for r in rows(url))


def test_skip_locked_lets_a_second_relay_past_a_held_claim(app: Any, db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer: the second relay waits by design")
    ids = commit_rows(app, 20)
    holding, release = threading.Event(), threading.Event()
    first: list[str] = []

    def slow_send(_app: Any, claimed: Sequence[Row]) -> None:
        first.extend(row.task_id for row in claimed)
        holding.set()
        release.wait(30)

    thread = threading.Thread(
        target=relay_once, args=(app,), kwargs={"limit": 10, "send": slow_send}
    )
    thread.start()
    assert holding.wait(30)
    second: list[str] = []
    engine = sa.create_engine(db_url)
    # Returns while the first claim is still held: its 10 rows are skipped, not waited on.
    assert (
        relay_once(
            app, limit=20, engine=engine, send=lambda _a, r: second.extend(x.task_id for x in r)
        )
        == 10
    )
    release.set()
    thread.join(30)
    engine.dispose()
    assert sorted(first + second) == sorted(ids) and not set(first) & set(second)


def test_a_failed_publish_leaves_the_rows_for_the_next_pass(app: Any) -> None:
    ids = commit_rows(app, 3)

    def broker_down(_app: Any, _rows: Sequence[Row]) -> None:
        raise ConnectionError("broker down")

    with pytest.raises(ConnectionError):
        relay_once(app, send=broker_down)
    assert all(r.published_at is None for r in rows(app.jobs_settings.database_url))
    again: list[str] = []
    assert relay_once(app, send=lambda _a, r: again.extend(x.task_id for x in r)) == 3
    assert again == ids  # oldest first, the same ids


def test_backlog_and_prune(app: Any) -> None:
    url = app.jobs_settings.database_url
    commit_rows(app, 4)
    now = dt.datetime.now(dt.UTC)
    with engine_for(url).connect() as conn:
        waiting = backlog(conn, now + dt.timedelta(seconds=30))
    assert waiting.depth == 4 and 29 <= waiting.oldest_age_s <= 90
    relay_once(app, limit=3, send=lambda _a, _r: None)
    with engine_for(url).connect() as conn:
        assert backlog(conn).depth == 1
    engine = engine_for(url)
    assert prune(engine, 3600, now=now) == 0  # published just now: kept for the retention
    assert prune(engine, 3600, now=now + dt.timedelta(hours=2)) == 3
    [left] = rows(url)
    assert left.published_at is None  # a waiting row is never pruned
    with engine.connect() as conn:
        assert backlog(conn).depth == 1
