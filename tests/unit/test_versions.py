"""Payload versions: the declaration's refusals and the worker's screen (pure: no service)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from jobs_platform import ConfigError, ReliableTask, create_app, history, rules, versions
from jobs_platform.settings import Settings


@pytest.fixture()
def app() -> Any:
    return create_app("unitv", broker_url="memory://", result_backend="cache+memory://")


def ship(key: str, street: str, city: str) -> None:
    return None


def split(args: Any, kwargs: Any) -> tuple[Any, Any]:
    key, address = args
    street, _, city = address.rpartition(", ")
    return (key, street, city), kwargs


def identity(args: Any, kwargs: Any) -> tuple[Any, Any]:
    return args, kwargs


# -- declaration ------------------------------------------------------------------------------


def test_version_and_upcast_resolve_into_the_spec(app: Any) -> None:
    task = app.task(base=ReliableTask, name="v.ship", queue="fast", version=2, upcast={1: split})(
        ship
    )
    assert task.spec.versions == versions.Versions(2, {1: split})
    plain = app.task(base=ReliableTask, name="v.plain", queue="fast")(ship)
    assert plain.spec.versions.version == 1
    assert plain.spec.versions.upcast == {}


@pytest.mark.parametrize(
    ("version", "upcast", "message"),
    [
        (3, {1: identity}, r"missing: 2"),
        (3, {2: identity}, r"missing: 1"),
        (2, {}, r"version=2 needs upcast\[k\] for every older version k; missing: 1"),
        (2, {1: identity, 2: identity}, r"upcast key 2 is not an older version"),
        (1, {1: identity}, r"upcast key 1 is not an older version: with version=1"),
        (2, {0: identity, 1: identity}, r"upcast key 0"),
        (2, {"1": identity}, r"upcast key '1'"),
        (2, {1: "split"}, r"upcast\[1\] must be callable"),
        (2, [identity], r"upcast is a dict"),
        (0, {}, r"version is the payload's version, a whole number >= 1"),
        (True, {}, r"version is the payload's version"),
        ("2", {}, r"version is the payload's version"),
        (2.0, {1: identity}, r"version is the payload's version"),
    ],
)
def test_declaration_refuses_bad_versions_and_upcasters(
    app: Any, version: Any, upcast: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        app.task(base=ReliableTask, name="v.bad", queue="fast", version=version, upcast=upcast)(
            ship
        )
    assert "v.bad" not in app._tasks  # a refused task is not left callable


def test_class_form_refuses_a_gap_too(app: Any) -> None:
    class Ship(ReliableTask):
        name = "v.class"
        queue = "fast"
        version = 3
        upcast = {1: identity}

        def run(self, key: str) -> None:
            return None

    with pytest.raises(ConfigError, match=r"v.class.*missing: 2"):
        app.register_task(Ship())


def test_a_misspelt_option_gets_a_hint(app: Any) -> None:
    with pytest.raises(ConfigError, match=r"unknown option 'versoin'; did you mean 'version'"):
        app.task(base=ReliableTask, name="v.typo", queue="fast", versoin=2)(ship)
    with pytest.raises(ConfigError, match=r"did you mean 'upcast'"):
        app.task(base=ReliableTask, name="v.typo2", queue="fast", upcasts={})(ship)


def test_the_rules_alone() -> None:
    assert rules.check_declared_version(4, task="t") == 4
    assert rules.check_declared_upcast(None, version=1, task="t") == {}
    assert rules.check_declared_upcast({1: identity}, version=2, task="t") == {1: identity}


def test_the_skew_window_is_a_setting_of_at_least_ten_minutes() -> None:
    assert Settings().version_skew_window >= 600
    with pytest.raises(ConfigError, match="version_skew_window must be > 0"):
        Settings(version_skew_window=0)


# -- the screen -------------------------------------------------------------------------------

V2 = versions.Versions(2, {1: split})
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def bind(key: str, street: str, city: str) -> None:
    return None


def screen(headers: Any, args: Any, kwargs: Any = None, *, at: dt.datetime = NOW) -> Any:
    return versions.screen(
        "v.ship",
        V2,
        headers,
        args,
        kwargs or {},
        bind=bind,
        now_s=at.timestamp(),
        window_s=600.0,
        stamp=at.isoformat(),
    )


def test_the_current_version_runs_as_sent() -> None:
    step = screen({history.VERSION_HEADER: 2}, ("k", "1 Main St", "Springfield"))
    assert step == versions.Run(("k", "1 Main St", "Springfield"), {})


def test_an_older_payload_and_one_without_a_header_are_upcast() -> None:
    expected = versions.Run(("k", "1 Main St", "Springfield"), {})
    assert screen({history.VERSION_HEADER: 1}, ["k", "1 Main St, Springfield"]) == expected
    assert screen({}, ["k", "1 Main St, Springfield"]) == expected  # predates versions: 1
    assert screen(None, ["k", "1 Main St, Springfield"]) == expected


def test_upcasters_run_in_order() -> None:
    seen: list[int] = []

    def step(n: int) -> Any:
        def up(args: Any, kwargs: Any) -> Any:
            seen.append(n)
            return [*args, n], kwargs

        return up

    spec = versions.Versions(4, {3: step(3), 1: step(1), 2: step(2)})
    assert versions.upcast("t", spec, 1, (), {}) == ((1, 2, 3), {})
    assert seen == [1, 2, 3]
    assert versions.upcast("t", spec, 3, (0,), {}) == ((0, 3), {})


def test_a_newer_payload_is_deferred_with_the_start_of_its_wait() -> None:
    headers = {history.VERSION_HEADER: 3, "other": "kept"}
    step = screen(headers, ("anything",))
    assert isinstance(step, versions.Defer)
    assert step.payload_version == 3
    assert step.wait_s == 30.0  # a tenth of the window, at most 30 s
    assert step.headers == {**headers, history.VERSION_WAIT_HEADER: NOW.isoformat()}
    # Deferred again later: the wait keeps its start, and never looks past the window's end.
    later = screen(step.headers, ("anything",), at=NOW + dt.timedelta(seconds=590))
    assert isinstance(later, versions.Defer)
    assert later.headers[history.VERSION_WAIT_HEADER] == NOW.isoformat()
    assert later.wait_s == pytest.approx(10.0)


def test_a_newer_payload_past_the_window_is_version_skew_naming_both_versions() -> None:
    headers = {history.VERSION_HEADER: 3, history.VERSION_WAIT_HEADER: NOW.isoformat()}
    with pytest.raises(
        versions.VersionSkew,
        match=r"v.ship: payload of version 3 is newer than this worker's version 2; no "
        r"upgraded worker took it within 600 s",
    ):
        screen(headers, ("x",), at=NOW + dt.timedelta(seconds=600))


def test_arguments_that_do_not_bind_are_version_skew_not_a_plain_type_error() -> None:
    with pytest.raises(
        versions.VersionSkew,
        match=r"payload of version 2 does not fit the signature of version 2 \(TypeError: ",
    ):
        screen({history.VERSION_HEADER: 2}, ("k", "1 Main St, Springfield"))
    with pytest.raises(versions.VersionSkew, match=r"version 1 \(upcast\) does not fit"):
        screen({history.VERSION_HEADER: 1}, ("k", "1 Main St, Springfield"), {"extra": 1})


def test_a_failing_upcaster_or_a_bad_header_is_version_skew() -> None:
    with pytest.raises(versions.VersionSkew, match=r"upcast\[1\] \(version 1 -> 2\) failed"):
        screen({history.VERSION_HEADER: 1}, ("k",))
    bad = versions.Versions(2, {1: lambda args, kwargs: None})
    with pytest.raises(versions.VersionSkew, match=r"must return \(args, kwargs\)"):
        versions.upcast("t", bad, 1, (), {})
    for value in (0, "2", True, None):
        with pytest.raises(versions.VersionSkew, match="not a version"):
            versions.version_of({history.VERSION_HEADER: value})


def test_dispatch_stamps_the_version_and_keeps_a_given_one(app: Any) -> None:
    from jobs_platform import dispatch

    task = app.task(base=ReliableTask, name="v.stamp", queue="fast", version=2, upcast={1: split})(
        ship
    )
    assert dispatch.versioned(task, {})["headers"] == {history.VERSION_HEADER: 2}
    given = {"headers": {history.VERSION_HEADER: 1}}
    assert dispatch.versioned(task, given) is given


def test_a_republish_skips_the_argument_check_a_dispatch_makes(app: Any) -> None:
    from jobs_platform import signature_check

    task = app.task(base=ReliableTask, name="v.check", queue="fast")(ship)
    with pytest.raises(TypeError):
        task.__header__("k")
    with signature_check.unchecked():
        task.__header__("k")  # a checked job re-published (its arguments may be older)
        with pytest.raises(TypeError):
            task.bind_arguments("k")  # the worker's screen always binds
