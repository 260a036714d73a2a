"""The circuit-breaker options (breaker_threshold/window/cooldown) are checked when the task
is declared, and which failures count against the downstream is decided by the spec (pure:
a memory:// app, no broker contact)."""

from __future__ import annotations

import urllib.error
from typing import Any

import pytest

from jobs_platform import ConfigError, PermanentError, ReliableTask, create_app
from jobs_platform.flow import options
from jobs_platform.spec import GiveUp, RetryIn


@pytest.fixture()
def app() -> Any:
    return create_app("unit", broker_url="memory://", result_backend="cache+memory://")


def body(account: str) -> None:
    return None


def declare(app: Any, name: str, **declared: Any) -> Any:
    return app.task(base=ReliableTask, name=name, queue="thirdparty", **declared)(body)


def test_any_breaker_option_gives_the_rate_key_a_breaker_with_the_defaults(app: Any) -> None:
    task = declare(app, "u.partner", rate_key="partner-x", breaker_threshold=3)
    assert task.spec.breaker == options.Breaker("partner-x", 3, 60.0, 30.0)
    full = declare(
        app,
        "u.full",
        rate_limit="10/s",
        breaker_threshold=10,
        breaker_window=120,
        breaker_cooldown=5.5,
    )
    # rate_limit alone names the task itself as the downstream.
    assert full.spec.breaker == options.Breaker("u.full", 10, 120.0, 5.5)
    assert declare(app, "u.none", rate_key="partner-x").spec.breaker is None
    cooldown_only = declare(app, "u.cool", rate_key="partner-y", breaker_cooldown=10)
    assert cooldown_only.spec.breaker == options.Breaker("partner-y", 5, 60.0, 10.0)


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ({"breaker_threshold": 3}, "rate_key='partner-x'"),
        ({"rate_key": "p", "breaker_threshold": 0}, "breaker_threshold is a whole number"),
        ({"rate_key": "p", "breaker_threshold": 2.5}, "breaker_threshold is a whole number"),
        ({"rate_key": "p", "breaker_threshold": True}, "breaker_threshold is a whole number"),
        ({"rate_key": "p", "breaker_window": 0}, "breaker_window is a number of seconds > 0"),
        ({"rate_key": "p", "breaker_window": "1m"}, "breaker_window is a number of seconds"),
        ({"rate_key": "p", "breaker_cooldown": -1}, "breaker_cooldown is a number of seconds"),
        ({"rate_key": "p", "breaker_cooldown": float("inf")}, "breaker_cooldown is a number"),
        ({"rate_key": "p", "breaker_cooldown": 10**9}, "longer than JOBS_MAX_DELAY"),
    ],
)
def test_bad_breaker_options_are_refused_at_declaration(
    app: Any, declared: dict[str, Any], words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        declare(app, "u.bad", **declared)
    assert "u.bad" not in app.tasks


def test_a_misspelt_breaker_option_is_refused_with_a_hint(app: Any) -> None:
    with pytest.raises(ConfigError, match="did you mean 'breaker_threshold'"):
        declare(app, "u.typo", rate_key="p", breaker_treshold=3)


def test_transient_failures_count_against_the_downstream_permanent_ones_do_not(
    app: Any,
) -> None:
    spec = declare(app, "u.counted", rate_key="partner-x", breaker_threshold=3, max_retries=1).spec

    def step(exc: BaseException, attempt: int = 1) -> Any:
        return spec.decide(exc, attempt)

    def http(status: int) -> urllib.error.HTTPError:
        return urllib.error.HTTPError("http://partner", status, "x", None, None)  # type: ignore[arg-type]

    assert isinstance(step(ConnectionRefusedError()), RetryIn)
    assert spec.counts_against_downstream(step(ConnectionRefusedError()))
    assert spec.counts_against_downstream(step(http(503)))
    assert spec.counts_against_downstream(step(TimeoutError()))
    # The last attempt's transient failure is still the downstream's.
    exhausted = step(http(502), attempt=2)
    assert isinstance(exhausted, GiveUp) and exhausted.outcome == "exhausted"
    assert spec.counts_against_downstream(exhausted)
    # The job's own fault: a 400, a validation error, a PermanentError.
    assert not spec.counts_against_downstream(step(http(400)))
    assert not spec.counts_against_downstream(step(ValueError("bad")))
    assert not spec.counts_against_downstream(step(PermanentError("no")))
    # Throttling is the rate key's pause, not an outage.
    assert not spec.counts_against_downstream(step(http(429)))
    # No breaker: nothing counts.
    plain = declare(app, "u.plain", rate_key="partner-x").spec
    assert not plain.counts_against_downstream(step(http(503)))
