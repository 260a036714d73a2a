"""Parsing ``rate_limit`` and resolving it into the spec (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from jobs_platform.errors import ConfigError
from jobs_platform.ratelimit import Rate, parse_rate
from jobs_platform.settings import Settings
from jobs_platform.spec import resolve


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("10/s", Rate(10, 1)),
        ("100/m", Rate(100, 60)),
        ("5/h", Rate(5, 3600)),
        ("3/10s", Rate(3, 10)),
    ],
)
def test_parse_rate(text: str, rate: Rate) -> None:
    assert parse_rate(text, task="t") == rate
    assert parse_rate(None, task="t") is None


@pytest.mark.parametrize("bad", ["10", "fast", "0/s", "-1/s", 10, "10/d"])
def test_bad_rates_are_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="rate_limit must look like"):
        parse_rate(bad, task="t")


def run(self: Any) -> None: ...


def test_the_rate_key_defaults_to_the_task_and_a_key_alone_only_pauses() -> None:
    settings = Settings.load(environ={})
    limited = resolve(
        "p.call",
        {"queue": "fast", "rate_limit": "2/s"},
        settings=settings,
        routed_queue=None,
        run=run,
    )
    assert (limited.rate, limited.rate_key, limited.rate_limited) == (Rate(2, 1), "p.call", True)
    pausable = resolve(
        "p.call",
        {"queue": "fast", "rate_key": "partner"},
        settings=settings,
        routed_queue=None,
        run=run,
    )
    assert (pausable.rate, pausable.rate_key) == (None, "partner")
    assert not resolve(
        "p", {"queue": "fast"}, settings=settings, routed_queue=None, run=run
    ).rate_limited
    with pytest.raises(ConfigError, match="rate_key names a downstream"):
        resolve(
            "p", {"queue": "fast", "rate_key": " "}, settings=settings, routed_queue=None, run=run
        )
