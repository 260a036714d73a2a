"""Business keys, stable idempotency keys and unique dispatch (the lock on the real Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from jobs_platform import ConfigError, DispatchError, ReliableTask, create_app
from jobs_platform.idempotency import business_identity, unique
from jobs_platform.process_local import REDIS_TIMEOUT_S


@pytest.fixture()
def app(redis_url: str) -> Iterator[Any]:
    app = create_app("uniquetest", broker_url=redis_url)
    yield app
    app.control.purge()  # no worker of this session should meet these messages


def declare(app: Any, **options: Any) -> Any:
    name = f"tests.unique.{uuid.uuid4().hex[:8]}"

    @app.task(base=ReliableTask, bind=True, name=name, queue="fast", **options)
    def charge(self: Any, order_id: int, amount: int = 0) -> None: ...

    return charge


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"business_key": ("order",)}, "business_key 'order' is not an argument"),
        ({"business_key": ("order_id",), "unique_for": 0}, "unique_for"),
        ({"business_key": ("order_id",), "unique_for": True}, "unique_for"),
        ({"business_key": ("order_id",), "unique_for": "60"}, "unique_for"),
    ],
)
def test_bad_declarations_fail_at_import(app: Any, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        declare(app, **options)


def test_the_idempotency_key_depends_on_the_business_key_only(app: Any) -> None:
    task = declare(app, business_key="order_id")
    assert task.spec.business_key == ("order_id",)
    by_position = unique.identity_of(task, [42, 100], {})
    by_keyword = unique.identity_of(task, [], {"order_id": 42, "amount": 7})
    assert by_position == by_keyword == f"{task.name}:order_id=42"
    task.push_request(args=[42], kwargs={"amount": 1}, id="x")
    try:
        assert task.idempotency_key == by_position
    finally:
        task.pop_request()


def test_without_a_business_key_there_is_no_idempotency_key(app: Any) -> None:
    task = declare(app)
    with pytest.raises(ConfigError, match="business_key"):
        task.idempotency_key  # noqa: B018


def test_identities_are_stable_and_long_ones_hashed() -> None:
    assert business_identity("t", {"a": {"y": 1, "x": [1, "2"]}}) == 't:a={"x":[1,"2"],"y":1}'
    long = business_identity("t", {"a": "x" * 500})
    assert long.startswith("t:sha256=") and len(long) < 255
    assert long == business_identity("t", {"a": "x" * 500})


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


def test_the_lock_client_has_socket_timeouts(redis_url: str) -> None:
    kwargs = unique.locks_for(redis_url).client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == REDIS_TIMEOUT_S
    assert kwargs["socket_connect_timeout"] == REDIS_TIMEOUT_S


def test_a_half_open_redis_fails_the_dispatch_instead_of_hanging(app: Any) -> None:
    # A listener that accepts connections and never answers: a half-open Redis.
    import socket

    silent = socket.create_server(("127.0.0.1", 0))
    try:
        url = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
        client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
        with pytest.raises(redis.exceptions.TimeoutError):
            unique.UniqueLocks(client).acquire("t:x", "a", 5)
        client.close()
    finally:
        silent.close()


def test_revoked_jobs_release_their_lock(app: Any) -> None:
    task = declare(app, business_key=("order_id",), unique_for=30)
    first = task.delay(11)

    class Request:
        id = first.id
        args = [11]
        kwargs: dict[str, Any] = {}

    unique._on_revoked(sender=task, request=Request())
    assert task.delay(11).id != first.id


def test_missing_business_key_argument_is_a_dispatch_error(app: Any) -> None:
    task = declare(app, business_key=("order_id",), unique_for=30)
    with pytest.raises(DispatchError):
        task.apply_async([], {"amount": 1})
