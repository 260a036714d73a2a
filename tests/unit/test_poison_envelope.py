"""What a queue item must be before kombu and Celery read it (jobs_platform.deadletter.envelope).

Tables of the bad input seen in the wild or built to break a field kombu or Celery reads
unguarded, and hypothesis over arbitrary bytes and JSON: a verdict never raises, and a
message kombu itself writes always passes.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from jobs_platform.deadletter import envelope
from jobs_platform.deadletter.envelope import UNDECODED, Refusal
from jobs_platform.payload import payload_size


def kombu_envelope(**changes: Any) -> dict[str, Any]:
    """A message as kombu's Redis transport writes it (what a real producer sends)."""
    task_id = str(uuid.uuid4())
    body = kombu_dumps([["k"], {"n": 1}, {"callbacks": None, "chain": None}])
    payload: dict[str, Any] = {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {"lang": "py", "task": "t.x", "id": task_id, "retries": 0},
        "properties": {
            "correlation_id": task_id,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": "fast"},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    payload.update(changes)
    return payload


def with_properties(**changes: Any) -> dict[str, Any]:
    payload = kombu_envelope()
    payload["properties"] = {**payload["properties"], **changes}
    return payload


# -- read_item --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "item",
    [
        b"not json",
        b'{"body": "x", ',  # cut short
        b"\x00\xff\xfe",
        b"[" * 100_000,  # nested beyond the decoder's recursion limit
        b'{"__type__": "nope", "__value__": 1}',  # kombu's type marker, unknown type
        b"",
    ],
)
def test_an_item_that_is_not_json_is_refused_with_the_decoders_reason(item: bytes) -> None:
    verdict = envelope.read_item(item, loads=kombu_loads)
    assert isinstance(verdict, Refusal)
    assert verdict.error_type == envelope.NOT_JSON
    assert verdict.error.startswith("not JSON (")


def test_an_item_is_parsed_as_kombu_parses_it() -> None:
    item = json.dumps(kombu_envelope()).encode()
    assert envelope.read_item(item, loads=kombu_loads) == json.loads(item)


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_reading_any_bytes_never_raises(item: bytes) -> None:
    envelope.read_item(item, loads=kombu_loads)


# -- envelope_problem / body_problem ----------------------------------------------------------


def test_a_message_kombu_writes_has_no_problem() -> None:
    payload = kombu_envelope()
    assert envelope.envelope_problem(payload) is None
    assert envelope.body_problem(payload) is None


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ([1, 2, 3], "a JSON list is not a message envelope"),
        (None, "a JSON NoneType is not a message envelope"),
        ({"body": "x", "content-type": "application/json"}, "no 'properties' object"),
        (kombu_envelope(properties=[1]), "no 'properties' object"),
        (with_properties(delivery_tag=None), "no 'properties.delivery_tag' string"),
        (with_properties(delivery_tag=""), "no 'properties.delivery_tag' string"),
        (with_properties(delivery_tag=["t"]), "no 'properties.delivery_tag' string"),
        (with_properties(delivery_info=None), "no 'properties.delivery_info' object"),
        (with_properties(delivery_info={"exchange": ""}), "delivery_info.routing_key"),
        (with_properties(delivery_info={"routing_key": "q"}), "delivery_info.exchange"),
        (kombu_envelope(headers=[1, 2]), "'headers' is not an object"),
        (kombu_envelope(headers=None), "'headers' is not an object"),
        (kombu_envelope(body=5), "'body' is not a string"),
        (kombu_envelope(**{"content-type": ["a"]}), "'content-type' is not a string"),
        (kombu_envelope(**{"content-encoding": 1}), "'content-encoding' is not a string"),
        (with_properties(body_encoding=64), "'properties.body_encoding' is not a string"),
    ],
)
def test_what_kombu_would_index_unguarded_must_be_there(payload: Any, expected: str) -> None:
    problem = envelope.envelope_problem(payload)
    assert problem is not None and expected in problem


def test_a_missing_headers_field_is_an_empty_one_as_for_kombu() -> None:
    payload = kombu_envelope()
    del payload["headers"]
    assert envelope.envelope_problem(payload) is None


@pytest.mark.parametrize("body", ["%%% not base64 %%%", "abc", "YWJj\n", "YW=Jj"])
def test_a_base64_body_must_be_strict_base64(body: str) -> None:
    problem = envelope.body_problem(kombu_envelope(body=body))
    assert problem is not None and problem.startswith("body is not base64")


def test_an_empty_or_unencoded_body_is_left_to_kombu() -> None:
    assert envelope.body_problem(kombu_envelope(body="")) is None
    plain = kombu_envelope(body="[[], {}, {}]")
    plain["properties"]["body_encoding"] = None
    assert envelope.body_problem(plain) is None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=20,
)
ENVELOPE_KEYS = ["body", "headers", "properties", "content-type", "content-encoding"]
PROPERTY_KEYS = ["delivery_tag", "delivery_info", "body_encoding", "priority"]


@settings(max_examples=300)
@given(
    st.dictionaries(st.sampled_from(ENVELOPE_KEYS), JSON_VALUES)
    | st.fixed_dictionaries(
        {"properties": st.dictionaries(st.sampled_from(PROPERTY_KEYS), JSON_VALUES)},
        optional={"body": JSON_VALUES, "headers": JSON_VALUES},
    )
    | JSON_VALUES
)
def test_judging_any_json_never_raises(payload: Any) -> None:
    problem = envelope.envelope_problem(payload)
    if problem is None:
        envelope.body_problem(payload)


# -- task_problem ------------------------------------------------------------------------------


def headers(**changes: Any) -> dict[str, Any]:
    return {"task": "t.x", "id": "1", "retries": 0, "timelimit": [None, None], **changes}


GOOD_CALL = [["k"], {"n": 1}, {"callbacks": None}]


def test_a_task_message_celery_writes_has_no_problem() -> None:
    assert envelope.task_problem(headers(), GOOD_CALL) is None
    assert envelope.task_problem(headers(timelimit=[30, 25.5]), [[], {}, None]) is None
    assert envelope.task_problem(headers(), UNDECODED) is None  # Celery reports its decoding


def test_a_message_without_a_task_header_is_left_to_celery() -> None:
    assert envelope.task_problem({"id": 5}, [1]) is None


@pytest.mark.parametrize(
    ("changes", "decoded", "expected"),
    [
        ({"id": None}, GOOD_CALL, "header 'id' is not a non-empty string"),
        ({"id": ""}, GOOD_CALL, "header 'id' is not a non-empty string"),
        ({"id": 7}, GOOD_CALL, "header 'id' is not a non-empty string"),
        ({"task": ["t"]}, GOOD_CALL, "header 'task' is not a non-empty string"),
        ({"shadow": {"a": 1}}, GOOD_CALL, "header 'shadow' is not a string"),
        ({"root_id": [1]}, GOOD_CALL, "header 'root_id' is not a string"),
        ({"retries": "x"}, GOOD_CALL, "header 'retries' is not a count"),
        ({"retries": -1}, GOOD_CALL, "header 'retries' is not a count"),
        ({"retries": True}, GOOD_CALL, "header 'retries' is not a count"),
        ({"timelimit": "soon"}, GOOD_CALL, "header 'timelimit' is not [hard, soft]"),
        ({"timelimit": [1]}, GOOD_CALL, "header 'timelimit' is not [hard, soft]"),
        ({"timelimit": [1, "x"]}, GOOD_CALL, "header 'timelimit' is not [hard, soft]"),
        ({"timelimit": [-1, None]}, GOOD_CALL, "header 'timelimit' is not [hard, soft]"),
        ({}, {"a": 1}, "body is not [args, kwargs, options]"),
        ({}, [["k"], {}], "body is not [args, kwargs, options]"),
        ({}, [5, {}, {}], "arguments are not a list and an object"),
        ({}, [[], [], {}], "arguments are not a list and an object"),
        ({}, [[], {}, [1]], "body options are not an object"),
    ],
)
def test_what_celery_reads_unguarded_must_be_well_formed(
    changes: dict[str, Any], decoded: Any, expected: str
) -> None:
    problem = envelope.task_problem(headers(**changes), decoded)
    assert problem is not None and expected in problem


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=10), JSON_VALUES), JSON_VALUES)
def test_judging_any_task_message_never_raises(raw_headers: dict[str, Any], decoded: Any) -> None:
    envelope.task_problem({"task": "t.x", **raw_headers}, decoded)


# -- the size limit ----------------------------------------------------------------------------


def test_payload_size_is_the_json_of_args_and_kwargs() -> None:
    assert payload_size(("ab",), {"k": 1}) == len('[["ab"], {"k": 1}]')
    assert payload_size(None, None) == len("[[], {}]")
    assert payload_size(["é"], {}, dumps=kombu_dumps) == len('[["\\u00e9"], {}]')


def test_a_body_within_the_limit_passes_unparsed() -> None:
    assert envelope.oversize(b"x" * 100, UNDECODED, max_bytes=100) is None


def test_a_large_body_is_measured_by_its_arguments_not_its_options() -> None:
    args = ["x" * 80]
    body = json.dumps([args, {}, {"chain": ["y" * 500]}]).encode()
    assert len(body) > 100
    assert envelope.oversize(body, json.loads(body), max_bytes=100) is None
    assert envelope.oversize(body, json.loads(body), max_bytes=50) == len(json.dumps([args, {}]))


def test_a_large_body_that_is_not_celerys_json_is_over_by_its_own_size() -> None:
    body = b"\x00" * 200
    assert envelope.oversize(body, UNDECODED, max_bytes=100) == 200
    other_json = b'{"a": "' + b"x" * 200 + b'"}'
    assert envelope.oversize(other_json, {"a": 1}, max_bytes=100) == len(other_json)


def test_decode_body_never_decodes_anything_but_json() -> None:
    assert envelope.decode_body(b"[1]", json_body=False) is UNDECODED
    assert envelope.decode_body(b"\x80\x04K\x01.", json_body=True) is UNDECODED
    assert envelope.decode_body(b"[1]", json_body=True) == [1]
