"""A fake Redis client with just what the recorder uses, and recording into it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jobs_platform.metrics import counters, keys


class FakePipeline:
    def __init__(self, client: FakeClient) -> None:
        self.client = client
        self.ops: list[tuple[Any, ...]] = []

    def hincrbyfloat(self, key: str, field: str, amount: float) -> FakePipeline:
        self.ops.append(("hincrbyfloat", key, field, amount))
        return self

    def hset(self, key: str, field: str, value: str) -> FakePipeline:
        self.ops.append(("hset", key, field, value))
        return self

    def execute(self) -> list[Any]:
        if self.client.down:
            raise ConnectionError("redis is down")
        for op, key, field, value in self.ops:
            table = self.client.hashes.setdefault(key, {})
            if op == "hincrbyfloat":
                table[field] = float(table.get(field, 0.0)) + value
            else:
                table[field] = value
        self.client.transactions.append(list(self.ops))
        return [None] * len(self.ops)


class FakeClient:
    """Applies a pipeline's commands at ``execute()``, all or nothing, like MULTI/EXEC."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, Any]] = {}
        self.transactions: list[list[tuple[Any, ...]]] = []
        self.down = False

    def pipeline(self, transaction: bool = True) -> FakePipeline:
        assert transaction, "counts must be written all or nothing"
        return FakePipeline(self)

    def hdel(self, key: str, *fields: str) -> int:
        if self.down:
            raise ConnectionError("redis is down")
        table = self.hashes.get(key, {})
        return sum(table.pop(field, None) is not None for field in fields)

    def totals(self) -> dict[counters.Series, float]:
        """The counters hash, decoded."""
        table = self.hashes.get(keys.COUNTERS_KEY, {})
        decoded = {counters.decode_field(field): value for field, value in table.items()}
        return {series: value for series, value in decoded.items() if series is not None}


@pytest.fixture()
def fake_redis() -> FakeClient:
    return FakeClient()


@pytest.fixture()
def recording(fake_redis: FakeClient) -> Iterator[FakeClient]:
    """Recording on in this process, into ``fake_redis`` (flushed only when asked)."""
    counters.activate("redis://fake", interval_s=3600, client=fake_redis)
    try:
        yield fake_redis
    finally:
        counters.deactivate()
