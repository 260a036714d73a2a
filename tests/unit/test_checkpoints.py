"""Checkpoint values: what a checkpoint may hold and how big (pure; no Redis)."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from jobs_platform import checkpoints, rules
from jobs_platform.errors import ConfigError, PermanentError


def test_a_value_round_trips_with_its_typed_values() -> None:
    value = {"row": 5, "at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC), "sum": decimal.Decimal("1.5")}
    assert checkpoints.decode(checkpoints.encode("t", value, max_bytes=1000)) == value
    assert checkpoints.decode(None) is None


def test_a_value_over_the_limit_is_refused_naming_its_size_and_the_setting() -> None:
    checkpoints.encode("t", "x" * 98, max_bytes=100)  # 100 bytes of JSON with its quotes
    with pytest.raises(checkpoints.CheckpointRefused) as info:
        checkpoints.encode("imports.rows", "x" * 99, max_bytes=100)
    assert isinstance(info.value, PermanentError)  # never retried: the same value again
    assert "imports.rows: checkpoint of 101 bytes" in str(info.value)
    assert "JOBS_CHECKPOINT_MAX_BYTES (100)" in str(info.value)


def test_a_value_json_cannot_carry_is_refused_naming_where_it_is() -> None:
    with pytest.raises(checkpoints.CheckpointRefused, match=r"checkpoint\['seen'\] is a set"):
        checkpoints.encode("t", {"seen": {1, 2}}, max_bytes=1000)


def test_the_ttl_must_outlive_a_retry_wait_and_a_redelivery() -> None:
    rules.check_checkpoints(max_bytes=10, ttl_s=100.0, max_delay_s=50.0, visibility_s=40.0)
    with pytest.raises(ConfigError, match="checkpoint_ttl 90 s must be longer than max_delay"):
        rules.check_checkpoints(max_bytes=10, ttl_s=90.0, max_delay_s=50.0, visibility_s=40.0)
    with pytest.raises(ConfigError, match="checkpoint_max_bytes"):
        rules.check_checkpoints(max_bytes=0, ttl_s=100.0, max_delay_s=5.0, visibility_s=4.0)
