"""A stored job's record: the exact payload survives JSON (unescaped, so the release
script pushes the same bytes), and the store's keys hang off one prefix."""

from __future__ import annotations

import json

from jobs_platform.brokers.redis.delayed import STORE, DelayedJob, Keys, store_args


def job(payload: str) -> DelayedJob:
    return DelayedJob(
        id="t-1",
        list="fast\x06\x166",
        payload=payload,
        task="app.send",
        queue="fast",
        priority=6,
        due=1_800_000_000_000,
        eta="2027-01-15T08:00:00+00:00",
        stored=1_799_999_000_000,
    )


def test_the_payload_round_trips_exactly_and_is_not_ascii_escaped() -> None:
    payload = json.dumps({"headers": {"argsrepr": "('Zoë 🚀', \"q\\\\x\")"}}, ensure_ascii=False)
    stored = job(payload).to_json()
    assert "Zoë 🚀" in stored  # raw UTF-8: the script's decoder has nothing to re-encode
    assert DelayedJob.from_json(stored) == job(payload)
    assert DelayedJob.from_json(stored.encode()).payload == payload


def test_unknown_record_fields_are_ignored_so_records_can_grow() -> None:
    data = json.loads(job("{}").to_json())
    data["added_later"] = 1
    assert DelayedJob.from_json(json.dumps(data)) == job("{}")


def test_store_args_are_one_eval_over_the_due_set_and_the_hash() -> None:
    keys = Keys("p")
    assert (keys.due, keys.jobs, keys.unreadable) == ("p:due", "p:jobs", "p:unreadable")
    args = store_args(keys, job("{}"))
    assert args[:6] == (STORE, 2, "p:due", "p:jobs", "t-1", 1_800_000_000_000)
    assert DelayedJob.from_json(args[6]) == job("{}")
