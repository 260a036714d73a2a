"""The settings table: precedence, parsing, validation (its documentation: test_docs.py)."""

from __future__ import annotations

import pytest

from jobs_platform import ConfigError, Settings


def test_defaults() -> None:
    s = Settings.load(environ={})
    assert s.broker_url == "redis://127.0.0.1:6379/0"
    assert s.database_url.startswith("sqlite:///")
    assert s.visibility_timeout == 3600
    assert s.result_backend_url == s.broker_url


def test_precedence_override_then_env_then_default() -> None:
    env = {"JOBS_VISIBILITY_TIMEOUT": "600", "JOBS_MAX_RETRIES": "7", "JOBS_RETRY_JITTER": "off"}
    s = Settings.load(environ=env, max_retries=2)
    assert s.visibility_timeout == 600.0
    assert s.max_retries == 2  # the override wins over the environment
    assert s.retry_jitter is False


def test_routes_from_json_env() -> None:
    s = Settings.load(environ={"JOBS_ROUTES": '{"billing.*": "thirdparty"}'})
    assert s.routes == {"billing.*": "thirdparty"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"JOBS_VISIBILITY_TIMEOUT": "abc"}, "JOBS_VISIBILITY_TIMEOUT='abc' is not a valid float"),
        ({"JOBS_RETRY_JITTER": "maybe"}, "not a valid bool"),
        ({"JOBS_ROUTES": "[1]"}, "JSON object"),
        ({"JOBS_ROUTES": '{"x.*": "nope"}'}, "known queues are fast, heavy, thirdparty"),
        ({"JOBS_VISIBILITY_TIMEOUT": "30", "JOBS_VISIBILITY_MARGIN": "30"}, "visibility_margin"),
        ({"JOBS_VISIBILITY_TIMEOUT": "-1"}, "visibility_timeout must be > 0"),
        ({"JOBS_MAX_RETRIES": "-2"}, "max_retries"),
        ({"JOBS_DEFAULT_QUEUE": "slow"}, "unknown queue 'slow'"),
    ],
)
def test_bad_values_are_refused_clearly(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.load(environ=env)


def test_unknown_override_is_refused_with_the_known_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting.*visibilty_timeout.*known"):
        Settings.load(environ={}, visibilty_timeout=10)


@pytest.mark.parametrize(
    ("raw", "mode"),
    [
        ("auto", "auto"),
        ("on", "on"),
        ("off", "off"),
        (" ON ", "on"),
        ("true", "on"),
        ("1", "on"),
        ("yes", "on"),
        ("False", "off"),
        ("0", "off"),
        ("no", "off"),
    ],
)
def test_task_events_mode_and_its_old_boolean_spellings(raw: str, mode: str) -> None:
    assert Settings.load(environ={"JOBS_TASK_EVENTS": raw}).task_events == mode


def test_task_events_default_is_auto_and_bool_overrides_still_work() -> None:
    assert Settings.load(environ={}).task_events == "auto"
    assert Settings.load(environ={}, task_events=False).task_events == "off"
    assert Settings.load(environ={}, task_events=True).task_events == "on"
    # The override wins over the environment, as for every setting.
    assert Settings.load(environ={"JOBS_TASK_EVENTS": "on"}, task_events="auto").task_events == (
        "auto"
    )


@pytest.mark.parametrize("raw", ["maybe", "", "2", "enabled"])
def test_task_events_refuses_anything_else_at_load(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"JOBS_TASK_EVENTS=.* is not a task-events mode"):
        Settings.load(environ={"JOBS_TASK_EVENTS": raw})


def test_task_events_refuses_a_non_string_override() -> None:
    with pytest.raises(ConfigError, match="use auto"):
        Settings.load(environ={}, task_events=2)


@pytest.mark.parametrize("raw", ["0", "-5", "nan"])
def test_task_events_lease_must_be_positive(raw: str) -> None:
    with pytest.raises(ConfigError, match="task_events_lease must be > 0"):
        Settings.load(environ={"JOBS_TASK_EVENTS_LEASE": raw})
