"""The pure parts of a dead letter: fingerprint, redaction, dedupe key, spool JSON."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from jobs_platform.deadletter.record import (
    REDACTED,
    DeadLetter,
    fingerprint,
    normalise_message,
    redact,
)
from jobs_platform.testing import dead_letter


def letter(**overrides: Any) -> DeadLetter:
    return dead_letter(
        **{
            "task_id": "t-1",
            **({} if "errors" in overrides else {"message": "refused #12"}),
            "failed_at": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            "chain": "2026-01-02T03:04:00+00:00",
            **overrides,
        }
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # Same error about different records groups together...
        ("invoice 42 does not exist", "invoice 1337 does not exist"),
        (
            "user 5f0c2a1e-8b3d-4c1a-9e2f-0a1b2c3d4e5f locked",
            "user 0b1e2a3c-4d5e-4f60-8a7b-9c0d1e2f3a4b locked",
        ),
        ("object deadbeef01 missing", "object 0123abcd99 missing"),
        ("key 'abc' not found", "key 'xyz' not found"),
    ],
)
def test_fingerprint_ignores_numbers_ids_and_quoted_values(a: str, b: str) -> None:
    assert normalise_message(a) == normalise_message(b)
    assert fingerprint("t", "E", a, status=None, reason="permanent") == fingerprint(
        "t", "E", b, status=None, reason="permanent"
    )


def test_fingerprint_separates_task_type_and_wording() -> None:
    def fp(task: str, error_type: str, message: str) -> str:
        return fingerprint(task, error_type, message, status=None, reason="permanent")

    base = fp("t", "ValueError", "bad amount 3")
    assert base != fp("u", "ValueError", "bad amount 3")
    assert base != fp("t", "KeyError", "bad amount 3")
    assert base != fp("t", "ValueError", "bad currency 3")
    assert len(base) == 16


def http_letter(status: int, reason: str, url_id: int) -> DeadLetter:
    message = f"HTTP Error {status}: for http://partner/invoices/{url_id}"
    entry = {"type": "urllib.error.HTTPError", "message": message, "at": "x", "attempt": 1}
    return letter(reason=reason, errors=[{**entry, "status": status}])


def test_fingerprint_separates_http_status_and_failure_reason() -> None:
    # Normalising makes "HTTP Error 404" and "HTTP Error 503" the same text: the status and
    # the reason must keep a 404 (permanent) and a 503 (exhausted) of one task apart, or a
    # bulk replay by fingerprint would replay both causes.
    not_found, unavailable = http_letter(404, "permanent", 1), http_letter(503, "exhausted", 1)
    assert normalise_message(not_found.error_message) == normalise_message(
        unavailable.error_message
    )
    assert not_found.fingerprint != unavailable.fingerprint
    # Each part on its own is enough.
    assert http_letter(404, "exhausted", 1).fingerprint != unavailable.fingerprint
    assert http_letter(503, "permanent", 1).fingerprint != unavailable.fingerprint
    # ... while the same cause about another record still groups.
    assert http_letter(503, "exhausted", 99).fingerprint == unavailable.fingerprint


def test_fingerprint_of_a_letter_without_status_is_stable() -> None:
    assert letter().http_status is None
    expected = fingerprint(
        "billing.charge",
        "builtins.ConnectionError",
        "refused #12",
        status=None,
        reason="exhausted",
    )
    assert letter().fingerprint == expected
    assert letter(reason="time_limit").fingerprint != expected


@pytest.mark.parametrize("status", [True, "503", 503.0, None])
def test_only_an_integer_status_counts(status: object) -> None:
    errors = [{"type": "E", "message": "m", "at": "x", "attempt": 1, "status": status}]
    assert letter(errors=errors).http_status is None
    assert letter(errors=[]).http_status is None


def test_redact_masks_configured_keys_recursively_and_case_insensitively() -> None:
    value = {
        "user": "ann",
        "Password": "x",
        "card": {"card_number": "4111", "exp": "12/30"},
        "items": [{"token": "t"}, 3],
    }
    masked, hit = redact(value, ["password", "card_number", "token"])
    assert hit
    assert masked == {
        "user": "ann",
        "Password": REDACTED,
        "card": {"card_number": REDACTED, "exp": "12/30"},
        "items": [{"token": REDACTED}, 3],
    }
    assert value["Password"] == "x"  # the original is untouched
    assert redact(["a", 1], ["password"]) == (["a", 1], False)


def test_letter_redaction_marks_the_row() -> None:
    masked = letter(args=["a"], kwargs={"secret": "s", "n": 1}).redact(["secret"])
    assert masked.kwargs == {"secret": REDACTED, "n": 1}
    assert masked.redacted
    assert not letter(args=["a"], kwargs={}).redact(["secret"]).redacted


def test_dedupe_key_is_one_per_task_id_and_chain() -> None:
    first = letter()
    assert first.dedupe_key == letter(reason="time_limit", errors=[]).dedupe_key
    assert first.dedupe_key != letter(chain="2026-01-05T00:00:00+00:00").dedupe_key
    assert first.dedupe_key != letter(task_id="t-2").dedupe_key


def test_spool_json_round_trip_keeps_everything() -> None:
    original = letter(
        args=[1, "two"],
        kwargs={"k": [3]},
        headers={"h": 1},
        priority=5,
        enqueued_at=dt.datetime(2026, 1, 2, 3, 0, tzinfo=dt.UTC),
        replay_of=7,
    )
    assert DeadLetter.from_json(original.to_json()) == original


def test_row_carries_derived_columns() -> None:
    row = letter().row()
    assert row["error_type"] == "builtins.ConnectionError"
    assert row["fingerprint"] == letter().fingerprint
    assert row["status"] == "dead"
    assert "chain" not in row
