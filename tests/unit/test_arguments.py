"""One rule for a job's argument values (jobs_platform.arguments), held at every place they
are sent, stored or sent again: ``.delay()``, ``delay_many``, a beat entry, a dead letter
(its spool copy and its row) and a replay (pure: memory:// broker, no service)."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from decimal import Decimal
from typing import Any

import pytest
from celery.schedules import schedule as every

from jobs_platform import DispatchError, ReliableTask, arguments, create_app, rules
from jobs_platform.bulk import BulkDispatchError
from jobs_platform.deadletter.record import DeadLetter
from jobs_platform.deadletter.replay import ReplayRefused, check_replayable, publisher
from jobs_platform.errors import ConfigError
from jobs_platform.testing import dead_letter

WHEN = dt.datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=dt.UTC)
AMOUNT = Decimal("19.90")
ID = uuid.UUID("12345678-1234-5678-1234-567812345678")

#: Every value kombu's JSON carries with its type, as a task would be called with it.
TYPED = {
    "aware": WHEN,
    "naive": dt.datetime(2026, 3, 1, 12, 30),
    "day": dt.date(2026, 3, 1),
    "at": dt.time(9, 15),
    "amount": AMOUNT,
    "id": ID,
    "text_bytes": b"abc",
    "raw_bytes": b"\xff\x00",
}


@pytest.mark.parametrize(
    ("args", "kwargs", "path", "what"),
    [
        ((), {"tags": {"a", "b"}}, "kwargs['tags']", "a set"),
        ((1, {"items": [1, 2, frozenset()]}), {}, "args[1]['items'][2]", "a frozenset"),
        ((object(),), {}, "args[0]", "an object"),
        ((), {"by": {(1, 2): "x"}}, "kwargs['by']", "a mapping with a key of type tuple"),
        ((WHEN, {1}), {}, "args[1]", "a set"),  # the first value that cannot be carried
    ],
)
def test_a_value_json_cannot_carry_is_found_by_its_path(
    args: tuple[Any, ...], kwargs: dict[str, Any], path: str, what: str
) -> None:
    found = arguments.unsendable(args, kwargs)
    assert found is not None
    assert found[0] == path and found[1].startswith(what)


def test_typed_values_round_trip_through_a_stored_dead_letter() -> None:
    assert arguments.unsendable((WHEN, [AMOUNT]), TYPED) is None
    stored = arguments.to_stored({"args": [WHEN, (AMOUNT, ID)], "kwargs": TYPED})
    text = json.dumps(stored)  # plain JSON: what a JSON/JSONB column holds
    assert "datetime.datetime(" not in text and "Decimal(" not in text  # never a repr
    assert stored["args"][0] == {"__type__": "datetime", "__value__": WHEN.isoformat()}
    back = arguments.from_stored(json.loads(text))
    assert back == {"args": [WHEN, [AMOUNT, ID]], "kwargs": TYPED}
    assert type(back["kwargs"]["day"]) is dt.date and back["kwargs"]["naive"].tzinfo is None


def test_a_dead_letter_stores_typed_arguments_tagged_in_its_spool_copy_and_its_row() -> None:
    """It used to spool a repr (json default=repr) and fail the row's JSON column."""
    letter = dead_letter(args=[WHEN, AMOUNT], kwargs={"id": ID, "day": dt.date(2026, 3, 1)})
    text = letter.to_json()
    assert "datetime.datetime(" not in text and "UUID(" not in text
    spooled = DeadLetter.from_json(text)
    row = spooled.row()
    json.dumps(row["args"]), json.dumps(row["kwargs"])  # storable as they are
    assert arguments.from_stored(row["args"]) == [WHEN, AMOUNT]
    assert arguments.from_stored(row["kwargs"]) == {"id": ID, "day": dt.date(2026, 3, 1)}
    assert row == letter.row()  # the spool copy and the direct write store the same row


def test_a_value_that_cannot_be_stored_keeps_the_letter_names_its_type_and_is_not_replayed() -> (
    None
):
    letter = dead_letter(args=[{"seen": {1, 2}}])  # a task that changed its own arguments
    row = {**letter.row(), "id": 7}
    assert row["args"] == [
        {"seen": {"__type__": arguments.UNSTORABLE, "__value__": "builtins.set"}}
    ]
    with pytest.raises(ReplayRefused, match=r"dead letter 7's args held a builtins\.set"):
        check_replayable(row)


@pytest.fixture()
def app() -> Any:
    made = create_app("argsunit", broker_url="memory://", result_backend="cache+memory://")

    @made.task(base=ReliableTask, name="u.settle", queue="fast")
    def settle(*args: Any, **kwargs: Any) -> None:
        return None

    made.settle = settle
    return made


def test_delay_and_delay_many_refuse_a_set_naming_the_argument(app: Any) -> None:
    """``.delay()`` used to say only "Object of type set is not JSON serializable"."""
    with pytest.raises(DispatchError) as refused:
        app.settle.delay(1, tags={"a"})
    assert str(refused.value).startswith("u.settle: argument kwargs['tags'] is a set")
    with pytest.raises(BulkDispatchError) as bulk:
        app.settle.delay_many([(1,), (2, [{"x": {3}}])])
    assert bulk.value.index == 1
    assert "call 1 of 2 refused" in str(bulk.value) and "argument args[1][0]['x'] is a set" in str(
        bulk.value
    )


def test_delay_and_delay_many_send_typed_values_with_their_type(app: Any) -> None:
    app.settle.delay(WHEN, amount=AMOUNT, id=ID)
    app.settle.delay_many([(WHEN,), {"day": dt.date(2026, 3, 1)}])
    with app.connection_for_write() as conn:
        bodies = []
        while (message := conn.default_channel.basic_get("fast")) is not None:
            bodies.append(message.decode())
    assert [WHEN] in [body[0] for body in bodies]
    assert {"amount": AMOUNT, "id": ID} in [body[1] for body in bodies]
    assert {"day": dt.date(2026, 3, 1)} in [body[1] for body in bodies]


def test_a_beat_entry_with_a_set_is_refused_when_beat_starts_naming_the_entry() -> None:
    rules.check_beat_entry_arguments("nightly", [WHEN], {"on": dt.date(2026, 3, 1)})
    with pytest.raises(ConfigError, match=r"beat entry 'nightly': argument kwargs\['ids'\] is"):
        rules.check_beat_entry_arguments("nightly", [], {"ids": {1, 2}})

    from jobs_platform.schedule.scheduler import Scheduler

    app = create_app("beatargs", broker_url="memory://", result_backend="cache+memory://")
    app.conf.beat_schedule = {
        "nightly": {"task": "u.settle", "schedule": every(60), "args": [[1], {2}]}
    }
    with pytest.raises(ConfigError, match=r"beat entry 'nightly': argument args\[1\] is a set"):
        Scheduler(app)


def test_a_replay_sends_the_stored_values_with_their_type(app: Any) -> None:
    letter = dead_letter(task_name="u.settle", queue="fast", args=[WHEN], kwargs={"amount": AMOUNT})
    row = {**letter.row(), "id": 3}
    sent: dict[str, Any] = {}

    def apply_async(args: Any, kwargs: Any, **options: Any) -> None:
        sent.update(args=args, kwargs=kwargs, headers=options["headers"])

    app.settle.apply_async = apply_async
    publisher(app)(row, "new-id")
    assert sent["args"] == [WHEN] and sent["kwargs"] == {"amount": AMOUNT}
