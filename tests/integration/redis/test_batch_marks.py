"""A batch's open mark on the coordination Redis (jobs_platform.batches.marks): set when the
batch is created, deleted by a cancel before it commits; without the mark (or without
Redis) a member asks SQL, and a cancel that cannot delete the mark cancels nothing."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from celery.exceptions import Ignore

from jobs_platform import JobsPlatformError, ReliableTask, batch, create_app
from jobs_platform.batches import create, marks, running, state
from jobs_platform.db import upgrade

pytestmark = pytest.mark.integration


@pytest.fixture()
def app(redis_url: str, sqlite_url: str) -> Any:
    upgrade(sqlite_url)
    made = create_app("marks", broker_url=redis_url, database_url=sqlite_url)

    @made.task(base=ReliableTask, name="t.member", queue="fast")
    def member(n: int) -> None: ...

    return made


def test_created_batch_is_marked_open_and_a_cancel_deletes_the_mark_then_commits(
    app: Any, redis_url: str
) -> None:
    made = batch("marked", [app.tasks["t.member"].s(1), app.tasks["t.member"].s(2)], app=app)
    client = redis.Redis.from_url(redis_url)
    assert 0 < client.ttl(marks.key(made.id)) <= marks.TTL_S
    assert marks.is_open(app, made.id)
    running.before_body(app.tasks["t.member"], made.id, "m1")  # open: runs, no SQL read
    assert made.cancel("stop")
    assert not client.exists(marks.key(made.id))
    with pytest.raises(Ignore):  # no mark: SQL says cancelled
        running.before_body(app.tasks["t.member"], made.id, "m2")
    found = state.get(app, made.id)
    assert found.cancel_reason == "stop" and found.cancelled == 1 and found.pending == 1


class Down:
    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise redis.ConnectionError("down")

        return fail


def test_without_the_coordination_redis_members_ask_sql_and_a_cancel_cancels_nothing(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = batch("marked", [app.tasks["t.member"].s(1)], app=app)
    monkeypatch.setattr(marks.coordination, "client", lambda app: Down())
    assert not marks.is_open(app, made.id)
    running.before_body(app.tasks["t.member"], made.id, "m1")  # SQL: not cancelled
    with pytest.raises(JobsPlatformError, match="nothing was cancelled"):
        create.cancel(app, made.id, "stop")
    assert state.get(app, made.id).cancelled_at is None
    monkeypatch.undo()
    assert create.cancel(app, made.id, "stop")
    assert not marks.is_open(app, made.id)
