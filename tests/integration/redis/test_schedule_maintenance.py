"""The platform's maintenance tasks against the real database and Redis."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
import redis

from jobs_platform import create_app, db
from jobs_platform.deadletter.store import DeadLetterStore
from jobs_platform.idempotency.keys import IdempotencyKeys
from jobs_platform.idempotency.unique import UniqueLocks
from jobs_platform.schedule import maintenance
from jobs_platform.testing import dead_letter

pytestmark = pytest.mark.integration

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture()
def app(redis_url: str, sqlite_url: str) -> Any:
    db.upgrade(sqlite_url)
    app = create_app("maint", broker_url=redis_url, database_url=sqlite_url)
    return app


def run(app: Any, name: str, **kwargs: Any) -> Any:
    """The task body, in this process, on the real database and Redis."""
    return app.tasks[name].run(**kwargs)


def test_dead_letter_retention_deletes_only_old_resolved_rows(app: Any) -> None:
    store = DeadLetterStore(app.jobs_settings.database_url)
    old = NOW - dt.timedelta(days=45)
    ids = {
        name: store.add(dead_letter(failed_at=failed_at))
        for name, failed_at in [
            ("old_discarded", old),
            ("old_dead", old),
            ("new_discarded", NOW - dt.timedelta(days=2)),
        ]
    }
    store.discard([ids["old_discarded"], ids["new_discarded"]], reason="test", actor="t")
    done = run(app, maintenance.PURGE_DEAD_LETTERS, older_than_days=30)
    assert done["deleted"] == 1
    assert store.get(ids["old_discarded"]) is None
    assert store.get(ids["old_dead"]) is not None  # nobody resolved it: kept for a person
    assert store.get(ids["new_discarded"]) is not None
    assert run(app, maintenance.PURGE_DEAD_LETTERS, older_than_days=30)["deleted"] == 0


def test_retention_refuses_a_zero_age(app: Any) -> None:
    with pytest.raises(ValueError, match="older_than_days"):
        run(app, maintenance.PURGE_DEAD_LETTERS, older_than_days=0)


def test_expired_idempotency_keys_are_purged_and_live_ones_kept(app: Any) -> None:
    url = app.jobs_settings.database_url
    then = NOW - dt.timedelta(days=8)
    expired = IdempotencyKeys(url, ttl_s=86400, clock=lambda: then)
    live = IdempotencyKeys(url, ttl_s=86400)
    expired.record(expired.claim("old-key", task="t", lease_s=60), {"ok": 1})
    live.record(live.claim("new-key", task="t", lease_s=60), {"ok": 2})
    assert run(app, maintenance.PURGE_IDEMPOTENCY_KEYS) == {"deleted": 1}
    assert live.get("old-key") is None and live.get("new-key") is not None


def test_unique_lock_report_counts_held_locks_and_flags_any_without_ttl(
    app: Any, redis_url: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    held = f"report-{uuid.uuid4().hex[:6]}"
    UniqueLocks(client).acquire(held, "task-1", ttl_s=60)
    forever = f"jobs:unique:forever-{uuid.uuid4().hex[:6]}"
    client.set(forever, "task-2")  # not made by the platform: it never expires
    try:
        report = run(app, maintenance.CHECK_UNIQUE_LOCKS)
        assert report["held"] >= 2
        assert report["without_ttl"] == [forever]
        assert client.exists(forever)  # reported, not deleted: it is not ours to judge
    finally:
        client.delete(forever, f"jobs:unique:{held}")
        client.close()
