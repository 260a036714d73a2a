"""batch()'s contract refusals: one refused member (or callback) refuses the whole batch,
before anything is written or sent (the app's broker is never contacted: NO_BROKER)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from jobs_platform import BulkDispatchError, DispatchError, ReliableTask, batch, create_app
from jobs_platform.batches.model import batches
from jobs_platform.db import engine_for, upgrade
from tests.support.guards import NO_BROKER


@pytest.fixture()
def app(tmp_path: Path) -> Any:
    url = f"sqlite:///{tmp_path}/jobs.sqlite3"
    upgrade(url)
    app = create_app("batchunit", broker_url=NO_BROKER, database_url=url)

    @app.task(base=ReliableTask, name="t.member", queue="fast")
    def member(n: int) -> None: ...

    @app.task(base=ReliableTask, name="t.unique", queue="fast", business_key=("n",), unique_for=60)
    def unique(n: int) -> None: ...

    @app.task(name="t.plain")
    def plain(n: int) -> None: ...

    @app.task(base=ReliableTask, name="t.done", queue="fast")
    def done(batch_id: str) -> None: ...

    return app


def created(app: Any) -> int:
    with engine_for(app.jobs_settings.database_url).connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(batches)).scalar_one())


def refused(app: Any, signatures: list[Any], **kwargs: Any) -> DispatchError:
    with pytest.raises(DispatchError) as caught:
        batch("b", signatures, **kwargs)
    assert created(app) == 0  # nothing written (and nothing sent: the broker is unreachable)
    return caught.value


def test_a_member_with_wrong_arguments_refuses_the_batch_with_its_index(app: Any) -> None:
    member = app.tasks["t.member"]
    sigs = [member.s(1), member.s(2), member.s(1, 2, 3)]
    error = refused(app, sigs)
    assert isinstance(error, BulkDispatchError) and error.index == 2
    assert "batch member 2" in str(error) and "nothing was enqueued" in str(error)


def test_a_member_to_an_unknown_queue_refuses_the_batch(app: Any) -> None:
    member = app.tasks["t.member"]
    error = refused(app, [member.s(1), member.s(2).set(queue="nowhere")])
    assert "unknown queue 'nowhere'" in str(error)


def test_a_member_that_is_not_a_reliable_task_is_refused(app: Any) -> None:
    error = refused(app, [app.tasks["t.member"].s(1), app.tasks["t.plain"].s(2)])
    assert "batch member 1 (t.plain) is not a ReliableTask" in str(error)


def test_a_unique_for_member_is_refused(app: Any) -> None:
    error = refused(app, [app.tasks["t.unique"].s(1)])
    assert "declares unique_for" in str(error)


def test_two_members_with_one_task_id_are_refused(app: Any) -> None:
    member = app.tasks["t.member"]
    error = refused(app, [member.s(1).set(task_id="x"), member.s(2).set(task_id="x")])
    assert "task id x is given to two members" in str(error)


def test_something_else_than_a_signature_is_refused(app: Any) -> None:
    error = refused(app, [app.tasks["t.member"].s(1), (2,)])
    assert "batch member 1 must be a signature" in str(error)


@pytest.mark.parametrize(
    ("callback", "words"),
    [
        (lambda app: "t.done", "must be a signature"),
        (lambda app: app.tasks["t.done"].s().set(link="x"), "link cannot be sent by the outbox"),
        (lambda app: app.tasks["t.done"].s(1, 2), "refused"),  # takes only the batch id
    ],
)
def test_a_bad_callback_refuses_the_batch(app: Any, callback: Any, words: str) -> None:
    error = refused(app, [app.tasks["t.member"].s(1)], on_complete=callback(app))
    assert words in str(error) and "on_complete" in str(error)


@pytest.mark.parametrize("name", ["", "  ", "x" * 256, None])
def test_a_bad_name_is_refused(app: Any, name: Any) -> None:
    with pytest.raises(DispatchError, match="batch name"):
        batch(name, [app.tasks["t.member"].s(1)])
    assert created(app) == 0
