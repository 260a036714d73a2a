"""The idempotency-key table and its API, on SQLite created by the platform migrations."""

from __future__ import annotations

import socket
import urllib.error
from typing import Any

import pytest
import sqlalchemy as sa

from jobs_platform.db import engine_for, upgrade
from jobs_platform.errors import ConfigError, KeyInUse, PermanentError, TransientError
from jobs_platform.idempotency import IdempotencyKeys
from jobs_platform.idempotency.keys import cannot_have_reached
from tests.unit.idempotency.conftest import FakeClock


@pytest.fixture()
def keys(sqlite_url: str, clock: FakeClock) -> IdempotencyKeys:
    upgrade(sqlite_url)
    return IdempotencyKeys(sqlite_url, ttl_s=3600, clock=clock)


def test_migration_creates_the_table_with_a_unique_key(keys: IdempotencyKeys) -> None:
    inspector = sa.inspect(engine_for(keys.database_url))
    columns = {c["name"] for c in inspector.get_columns("idempotency_keys")}
    assert columns == {
        "id",
        "key",
        "task",
        "state",
        "owner",
        "result",
        "created_at",
        "updated_at",
        "lease_expires_at",
        "expires_at",
    }
    assert [u["column_names"] for u in inspector.get_unique_constraints("idempotency_keys")] == [
        ["key"]
    ]


def test_claim_record_then_duplicates_get_the_recorded_result(keys: IdempotencyKeys) -> None:
    first = keys.claim("k1", task="t", lease_s=30, owner="a")
    assert first.claimed
    busy = keys.claim("k1", task="t", lease_s=30, owner="b")
    assert (busy.outcome, busy.owner) == ("busy", "a")
    assert keys.record(first, {"email_id": "em_1"})
    done = keys.claim("k1", task="t", lease_s=30, owner="c")
    assert (done.outcome, done.result) == ("done", {"email_id": "em_1"})
    assert keys.get("k1")["state"] == "done"  # type: ignore[index]


def test_release_forgets_the_key_so_the_retry_claims_it(keys: IdempotencyKeys) -> None:
    first = keys.claim("k2", task="t", lease_s=30, owner="a")
    assert keys.release(first)
    assert keys.get("k2") is None
    assert keys.claim("k2", task="t", lease_s=30, owner="b").claimed


def test_an_expired_lease_is_taken_over_and_the_stale_owner_cannot_record(
    keys: IdempotencyKeys, clock: FakeClock
) -> None:
    stale = keys.claim("k3", task="t", lease_s=30, owner="a")
    clock.advance(31)
    fresh = keys.claim("k3", task="t", lease_s=30, owner="b")
    assert fresh.claimed
    assert keys.claim("k3", task="t", lease_s=30, owner="c").outcome == "busy"
    assert not keys.record(stale, "late")
    assert not keys.release(stale)
    assert keys.record(fresh, "ok")


def test_expired_rows_count_as_new_and_are_purged(keys: IdempotencyKeys, clock: FakeClock) -> None:
    keys.record(keys.claim("old", task="t", lease_s=30, owner="a"), 1)
    keys.record(keys.claim("young", task="t", lease_s=30, owner="a"), 1)
    clock.advance(3601)
    assert keys.claim("old", task="t", lease_s=30, owner="b").claimed
    assert keys.purge_expired() == 1  # "young"; "old" was renewed by its new claim
    assert keys.get("young") is None


def test_run_once_runs_once_and_returns_the_recorded_result(keys: IdempotencyKeys) -> None:
    calls: list[int] = []

    def send() -> dict[str, Any]:
        calls.append(1)
        return {"n": len(calls)}

    assert keys.run_once("k4", send, task="t", lease_s=30) == {"n": 1}
    assert keys.run_once("k4", send, task="t", lease_s=30) == {"n": 1}
    assert calls == [1]


def _raiser(exc: BaseException) -> Any:
    def fn() -> None:
        raise exc

    return fn


def _wrapped(cause: BaseException) -> BaseException:
    """A client's TransientError with the transport error as its explicit cause."""
    try:
        raise TransientError("gateway unreachable") from cause
    except TransientError as exc:
        return exc


class NewConnectionError(Exception):
    """Stands in for urllib3's (matched by qualified name, the library is not imported)."""


NewConnectionError.__module__ = "urllib3.exceptions"


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(111, "refused"),
        socket.gaierror(-2, "Name or service not known"),
        urllib.error.URLError(ConnectionRefusedError(111, "refused")),
        _wrapped(urllib.error.URLError(socket.gaierror(-2, "unknown host"))),
        _wrapped(NewConnectionError("pool: failed to establish a new connection")),
        PermanentError("the mailer refused the address: HTTP 422"),
    ],
    ids=["refused", "gaierror", "urlerror-refused", "wrapped-urlerror", "by-name", "permanent"],
)
def test_run_once_releases_the_key_when_the_call_cannot_have_reached_the_other_side(
    keys: IdempotencyKeys, error: BaseException
) -> None:
    with pytest.raises(type(error)):
        keys.run_once("k5", _raiser(error), task="t", lease_s=30)
    assert keys.get("k5") is None
    assert keys.run_once("k5", lambda: 1, task="t", lease_s=30) == 1


@pytest.mark.parametrize(
    "error",
    [
        TimeoutError("read timed out"),
        ConnectionResetError(104, "reset by peer"),
        urllib.error.URLError(TimeoutError("timed out")),
        _wrapped(TimeoutError("read timed out")),
        TransientError("mailer answered HTTP 502"),
        RuntimeError("bug after the send"),
    ],
    ids=["read-timeout", "reset", "urlerror-timeout", "wrapped-timeout", "5xx", "unknown"],
)
def test_run_once_keeps_the_key_when_the_call_may_have_happened(
    keys: IdempotencyKeys, clock: FakeClock, error: BaseException
) -> None:
    # The mailer may have sent before the error: a retry must not send again at once.
    sends: list[int] = []
    with pytest.raises(type(error)):
        keys.run_once("k7", _raiser(error), task="t", lease_s=30)
    row = keys.get("k7")
    assert row is not None and row["state"] == "claimed"
    clock.advance(10)
    with pytest.raises(KeyInUse) as busy:
        keys.run_once("k7", lambda: sends.append(1), task="t", lease_s=30)
    assert busy.value.retry_after_s == pytest.approx(20.5)  # the rest of the lease, then some
    assert sends == []
    clock.advance(21)  # the lease ran out: the next attempt takes the key over
    assert keys.run_once("k7", lambda: len(sends) + 1, task="t", lease_s=30) == 1


def test_a_kept_claim_is_not_taken_over_at_once_by_the_same_jobs_retry(
    keys: IdempotencyKeys, clock: FakeClock
) -> None:
    first = keys.claim("k8", task="t", lease_s=30, owner="job-1/h:1/a")
    kept = keys.keep(first)
    assert kept is not None and kept.owner == "kept:job-1/h:1/a"
    retry = keys.claim("k8", task="t", lease_s=30, owner="job-1/h:1/b", same_job="job-1/")
    assert retry.outcome == "busy"
    clock.advance(31)
    assert keys.claim("k8", task="t", lease_s=30, owner="job-1/h:1/c", same_job="job-1/").claimed


def test_a_database_error_while_settling_does_not_replace_the_original_error(
    keys: IdempotencyKeys, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def db_down(*args: Any) -> Any:
        raise sa.exc.OperationalError("DELETE", {}, Exception("database is locked"))

    monkeypatch.setattr(keys, "release", db_down)
    monkeypatch.setattr(keys, "keep", db_down)
    with pytest.raises(ConnectionRefusedError):
        keys.run_once("k9", _raiser(ConnectionRefusedError(111, "refused")), task="t", lease_s=30)
    with pytest.raises(TimeoutError):
        keys.run_once("k10", _raiser(TimeoutError("read")), task="t", lease_s=30)
    events = [r.__dict__.get("event") for r in caplog.records]
    assert events.count("jobs.key.release_failed") == 2


def test_cannot_have_reached_ignores_an_implicit_context() -> None:
    # A read timeout raised while handling an earlier refused connection: it may have sent.
    try:
        try:
            raise ConnectionRefusedError(111, "first host refused")
        except ConnectionRefusedError:
            raise TimeoutError("second host: read timed out") from None
    except TimeoutError as exc:
        assert not cannot_have_reached(exc)
    try:
        try:
            raise ConnectionRefusedError(111, "refused")
        except ConnectionRefusedError:
            raise TimeoutError("read timed out")  # noqa: B904
    except TimeoutError as exc:
        assert not cannot_have_reached(exc)


def test_run_once_reports_a_busy_key(keys: IdempotencyKeys) -> None:
    keys.claim("k5", task="t", lease_s=30, owner="elsewhere")
    with pytest.raises(KeyInUse, match="elsewhere"):
        keys.run_once("k5", lambda: 1, task="t", lease_s=30)


@pytest.mark.parametrize("key", ["", "x" * 256])
def test_bad_keys_are_refused(keys: IdempotencyKeys, key: str) -> None:
    with pytest.raises(ConfigError):
        keys.claim(key, task="t", lease_s=30)


def test_ttl_must_be_positive(sqlite_url: str) -> None:
    with pytest.raises(ConfigError):
        IdempotencyKeys(sqlite_url, ttl_s=0)


def test_the_model_and_migration_0002_agree(keys: IdempotencyKeys) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from jobs_platform.db import Base

    with engine_for(keys.database_url).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), Base.metadata)

    # Every alembic diff names its table in its repr (add_table, add_column, modify_type...).
    assert [d for d in diffs if "idempotency_keys" in repr(d)] == []


def test_a_later_attempt_of_the_same_job_takes_over_its_key_at_once(keys: IdempotencyKeys) -> None:
    keys.claim("k6", task="t", lease_s=30, owner="job-1/h:1/a")
    assert (
        keys.claim("k6", task="t", lease_s=30, owner="job-2/h:2/b", same_job="job-2/").outcome
        == "busy"
    )
    assert keys.claim("k6", task="t", lease_s=30, owner="job-1/h:3/c", same_job="job-1/").claimed
