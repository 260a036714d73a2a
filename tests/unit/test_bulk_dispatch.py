"""Bulk dispatch without a broker: every call is checked before anything is published, the
call forms, and the pieces the message copies rely on (pure; memory:// broker)."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from celery.utils.saferepr import saferepr

from jobs_platform import ReliableTask, create_app
from jobs_platform.bulk import BulkDispatchError
from jobs_platform.bulk.calls import new_ids
from jobs_platform.bulk.messages import PER_CALL_HEADERS, fast_repr


@pytest.fixture()
def app() -> Any:
    made = create_app(
        "bulkunit",
        broker_url="memory://",
        result_backend="cache+memory://",
        max_payload_bytes=2048,
        max_delay=3600,
    )

    @made.task(base=ReliableTask, name="u.add", queue="fast")
    def add(x: int, y: int = 0) -> int:
        return x + y

    @made.task(
        base=ReliableTask,
        name="u.charge",
        queue="fast",
        business_key=("invoice_id",),
        unique_for=60,
    )
    def charge(invoice_id: int, **extra: Any) -> int:
        return invoice_id

    made.add, made.charge = add, charge
    with made.connection_for_write() as conn:  # memory:// queues are shared in a process
        conn.default_channel.queue_purge("fast")
    return made


def queued(app: Any, queue: str = "fast") -> int:
    with app.connection_for_write() as conn:
        return int(conn.default_channel._size(queue))


@pytest.mark.parametrize(
    ("calls", "index", "words"),
    [
        ([(1, 2), 7], 1, "expected a tuple of positional arguments"),
        ([(1, 2), "ab"], 1, "got str"),
        ([(1,), (1, 2, 3)], 1, "takes"),  # the task's signature (Celery's typing check)
        ([(1,), {"x": 1, "z": 2}], 1, "unexpected keyword"),
        ([(1,), (object(),)], 1, "argument args[0] is an object, which a job's JSON cannot"),
        ([(1,), ("x" * 5000,)], 1, "JOBS_MAX_PAYLOAD_BYTES"),
    ],
)
def test_a_refused_call_stops_the_bulk_with_its_index_and_nothing_is_sent(
    app: Any, calls: list[Any], index: int, words: str
) -> None:
    with pytest.raises(BulkDispatchError) as refused:
        app.add.delay_many([(5,), *calls])
    assert refused.value.index == index + 1
    message = str(refused.value)
    assert f"call {index + 1} of {len(calls) + 1} refused, nothing was enqueued" in message
    assert words in message
    assert queued(app) == 0


def test_refused_options_name_the_options(app: Any) -> None:
    with pytest.raises(BulkDispatchError, match=r"options refused.*unknown queue"):
        app.add.apply_async_many([((1,), {})], queue="nope")
    with pytest.raises(BulkDispatchError, match=r"options refused.*JOBS_MAX_DELAY"):
        app.add.apply_async_many([((1,), {})], countdown=7200)
    assert queued(app) == 0


def test_a_signature_with_a_delay_too_long_is_refused_by_index(app: Any) -> None:
    calls = [app.add.s(1), app.add.s(2).set(countdown=7200)]
    with pytest.raises(BulkDispatchError, match=r"call 1 of 2 refused.*JOBS_MAX_DELAY") as err:
        app.add.apply_async_many(calls)
    assert err.value.index == 1
    assert queued(app) == 0


def test_a_unique_task_needs_its_business_key_in_every_call(app: Any) -> None:
    with pytest.raises(BulkDispatchError, match=r"call 1 of 2 refused.*invoice_id"):
        app.charge.apply_async_many([((1,), {}), ((), {"other": 2})])


def test_call_forms_of_apply_async_many(app: Any) -> None:
    with pytest.raises(BulkDispatchError, match=r"an .args, kwargs. pair or a signature"):
        app.add.apply_async_many([(1, 2)])
    with pytest.raises(BulkDispatchError, match=r"a signature of .u.charge., not of .u.add."):
        app.add.apply_async_many([app.charge.s(1)])
    results = app.add.apply_async_many(
        [((1,), {"y": 2}), ([3], None), app.add.s(4, y=5).set(priority=3)], priority=1
    )
    assert len(results) == 3
    assert len({r.id for r in results}) == 3
    assert queued(app) == 3


def test_delay_many_takes_argument_tuples_and_keyword_dicts(app: Any) -> None:
    results = app.add.delay_many([(1, 2), [3], {"x": 4}])
    assert [type(r).__name__ for r in results] == ["AsyncResult"] * 3
    assert queued(app) == 3
    assert app.add.delay_many([]) == []


def test_new_ids_are_uuid4_strings() -> None:
    ids = new_ids(500)
    assert len(set(ids)) == 500
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == text


def test_fast_repr_is_saferepr() -> None:
    rng = random.Random(7)
    plain = [0, -1, 10**40, 1.5, float("inf"), None, True, "", "abc", "a b-c_d", "é", "it's"]
    odd = ["a\nb", "back\\slash", b"x", [1], {"k": 1}, (1, 2), uuid.UUID(int=5)]
    samples: list[Any] = [(), [], {}, ("x" * 600,), tuple(range(300))]
    for _ in range(500):
        size = rng.randrange(0, 8)
        items = [rng.choice(plain + odd) for _ in range(size)]
        samples += [tuple(items), list(items), {f"k{i}": v for i, v in enumerate(items)}]
    for value in samples:
        assert fast_repr(value, 1024, 3) == saferepr(value, 1024, maxlevels=3), value


def test_only_the_per_call_fields_differ_between_two_messages_celery_builds(app: Any) -> None:
    """What the copies rely on: build two messages through Celery (different ids,
    arguments and delays) and check nothing else differs. A Celery upgrade that adds a
    per-message field fails here rather than in production."""
    amqp = app.amqp
    common = {"time_limit": 30, "soft_time_limit": 25, "create_sent_event": True}
    one = amqp.create_task_message(
        "id-1", "u.add", (1, 2), {}, countdown=None, root_id=None, **common
    )
    two = amqp.create_task_message(
        "id-2", "u.add", [3], {"y": 4}, countdown=30, root_id=None, **common
    )
    changed = {
        k
        for k in one.headers.keys() | two.headers.keys()
        if one.headers.get(k) != two.headers.get(k)
    }
    assert changed <= set(PER_CALL_HEADERS)
    changed_props = {
        k
        for k in one.properties.keys() | two.properties.keys()
        if one.properties.get(k) != two.properties.get(k)
    }
    assert changed_props <= {"correlation_id"}
    assert one.body[2] == two.body[2]
    changed_event = {
        k
        for k in one.sent_event.keys() | two.sent_event.keys()
        if one.sent_event.get(k) != two.sent_event.get(k)
    }
    assert changed_event <= {"uuid", "root_id", "args", "kwargs", "eta"}
