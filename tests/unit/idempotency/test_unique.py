"""Business keys, stable idempotency keys and what unique dispatch checks before Redis.

The lock itself, on the real Redis: tests/integration/redis/test_unique_dispatch.py.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis

from jobs_platform import ConfigError, DispatchError, ReliableTask, create_app
from jobs_platform.idempotency import business_identity, unique
from jobs_platform.process_local import REDIS_TIMEOUT_S
from tests.support.guards import NO_BROKER


@pytest.fixture()
def app() -> Any:
    return create_app("uniquetest", broker_url=NO_BROKER)


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


def test_the_lock_client_has_socket_timeouts() -> None:
    kwargs = unique.locks_for(NO_BROKER).client.connection_pool.connection_kwargs
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


def test_missing_business_key_argument_is_a_dispatch_error(app: Any) -> None:
    task = declare(app, business_key=("order_id",), unique_for=30)
    with pytest.raises(DispatchError):
        task.apply_async([], {"amount": 1})
