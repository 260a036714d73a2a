"""Unique dispatch on the real Redis: the lock is atomic, names the first job, and is
released when the job ends or is revoked (the checks before Redis are unit tests:
tests/unit/idempotency/test_unique.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform import create_app
from jobs_platform.idempotency import unique
from tests.unit.idempotency.test_unique import declare


@pytest.fixture()
def app(redis_url: str) -> Iterator[Any]:
    app = create_app("uniquetest", broker_url=redis_url)
    yield app
    app.control.purge()  # no worker of this session should meet these messages


def test_lock_is_atomic_and_compare_and_delete(
    redis_url: str, request: pytest.FixtureRequest
) -> None:
    client = redis.Redis.from_url(redis_url)
    request.addfinalizer(client.close)
    locks = unique.UniqueLocks(client)
    identity = f"t:{uuid.uuid4().hex}"
    assert locks.acquire(identity, "a", 5) == ("a", True)
    assert locks.acquire(identity, "b", 5) == ("a", False)
    assert not locks.release(identity, "b")  # not the owner
    assert locks.holder(identity) == "a"
    ttl_ms = locks.client.pttl(unique.LOCK_PREFIX + identity)
    assert 0 < ttl_ms <= 5000  # a killed worker's lock expires by itself
    assert locks.release(identity, "a")
    assert locks.holder(identity) is None


def test_dispatching_the_same_job_twice_returns_the_first_id(app: Any) -> None:
    task = declare(app, business_key=("order_id",), unique_for=30)
    first = task.delay(7)
    assert task.delay(7).id == first.id
    assert task.apply_async(kwargs={"order_id": 7, "amount": 3}).id == first.id
    other = task.delay(8)
    assert other.id != first.id
    # The job ends: postrun releases its lock (a retry does not).
    unique._on_postrun(sender=task, task_id=first.id, args=[7], kwargs={}, state="RETRY")
    assert task.delay(7).id == first.id
    unique._on_postrun(sender=task, task_id=first.id, args=[7], kwargs={}, state="SUCCESS")
    assert task.delay(7).id != first.id


def test_an_explicit_task_id_is_always_published(app: Any) -> None:
    task = declare(app, business_key=("order_id",), unique_for=30)
    first = task.delay(9)
    again = task.apply_async([9], task_id="explicit-id")  # e.g. a retry keeps its id
    assert again.id == "explicit-id"
    assert task.delay(9).id == first.id  # the lock still names the first job


def test_an_explicit_task_id_skips_the_lock(
    app: Any, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    task = declare(app, business_key=("order_id",), unique_for=30)
    identity = unique.identity_of(task, [10], {})

    def no_lock(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a call with an explicit task id must not touch the lock")

    monkeypatch.setattr(unique, "locks_for", no_lock)
    assert task.apply_async([10], task_id="retry-id").id == "retry-id"
    monkeypatch.undo()
    assert unique.locks_for(redis_url).holder(identity) is None  # nor take it
    first = task.delay(10)
    assert first.id != "retry-id"
    assert task.delay(10).id == first.id


def test_revoked_jobs_release_their_lock(app: Any) -> None:
    task = declare(app, business_key=("order_id",), unique_for=30)
    first = task.delay(11)

    class Request:
        id = first.id
        args = [11]
        kwargs: dict[str, Any] = {}

    unique._on_revoked(sender=task, request=Request())
    assert task.delay(11).id != first.id


def test_a_published_job_holds_its_lock_for_unique_for_and_a_pending_one_briefly(
    app: Any, redis_url: str
) -> None:
    """The lock is taken for the publish's bound (dispatch timeout + slack) and given its
    unique_for once the job is published, by .delay() and delay_many alike."""
    client = redis.Redis.from_url(redis_url)
    task = declare(app, business_key=("order_id",), unique_for=300)
    pending_ms = unique.pending_s(app.jobs_settings, 300) * 1000
    first = task.delay(21)
    [second, _] = task.delay_many([(22,), (22,)])
    for order, job in ((21, first), (22, second)):
        key = unique.LOCK_PREFIX + unique.identity_of(task, [order], {})
        assert client.get(key) == job.id.encode()
        assert pending_ms < client.pttl(key) <= 300_000
    # A lock already gone is not brought back: the job may have run and released it
    # before the producer confirmed (seen in CI: the receipt of a later invoice with the
    # same id was turned away for unique_for).
    locks = unique.locks_for(redis_url)
    identity = f"t:{uuid.uuid4().hex}"
    assert not locks.confirm(identity, "done", 300)
    assert locks.holder(identity) is None
    assert locks.acquire(identity, "other", 5) == ("other", True)
    assert not locks.confirm(identity, "done", 300)  # another dispatch holds it now
    assert locks.holder(identity) == "other"
    client.close()


def test_a_job_that_ends_before_its_producer_confirms_leaves_no_lock(
    app: Any, redis_url: str
) -> None:
    """The worker's task_postrun can release the lock before ``dispatch_once`` confirms it;
    the confirm must then leave it released, so the next dispatch is published."""
    client = redis.Redis.from_url(redis_url)
    task = declare(app, business_key=("order_id",), unique_for=300)
    key = unique.LOCK_PREFIX + unique.identity_of(task, [31], {})

    def publish_and_finish(args: Any, kwargs: Any, **options: Any) -> Any:
        result = task.AsyncResult(options["task_id"])
        unique.release_for(task, options["task_id"], args, kwargs)  # the job ran and ended
        return result

    first = unique.dispatch_once(task, [31], {}, {}, publish_and_finish)
    assert client.get(key) is None
    second = task.delay(31)
    assert second.id != first.id  # published, not turned away by a lock brought back
    assert client.get(key) == second.id.encode()
    client.close()
