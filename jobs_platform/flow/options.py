"""The flow options of a task declaration, validated when the task is declared (pure)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from jobs_platform.errors import ConfigError, JobsPlatformError

#: ``debounce_max`` when a task declares none: this many ``debounce`` windows after the
#: first collapsed dispatch, a steady stream still runs.
DEBOUNCE_MAX_FACTOR = 10.0

KeyFunction = Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` jobs whose ``key(*args, **kwargs)`` is the same run at once."""

    key: KeyFunction
    limit: int


@dataclasses.dataclass(frozen=True)
class Debounce:
    """Dispatches with the same ``key(*args, **kwargs)`` collapse into one run, started once
    the key was quiet for ``window_s`` (at the latest ``max_s`` after the first of them)."""

    window_s: float
    max_s: float
    #: ``None``: every dispatch of the task shares one key (the task's name).
    key: KeyFunction | None = None


def _seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


def concurrency(key: Any, limit: Any, *, task: str) -> Concurrency | None:
    """``concurrency_key`` / ``concurrency_limit`` as declared (the limit defaults to 1)."""
    if key is None:
        if limit is not None:
            raise ConfigError(
                f"task {task!r}: concurrency_limit needs a concurrency_key (a callable of the "
                "task's arguments returning the key, e.g. lambda account_id, **_: account_id)"
            )
        return None
    if not callable(key):
        raise ConfigError(
            f"task {task!r}: concurrency_key is a callable of the task's arguments returning "
            f"a string, got {key!r}"
        )
    limit = 1 if limit is None else limit
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"task {task!r}: concurrency_limit is an int >= 1, got {limit!r}")
    return Concurrency(key, limit)


def debounce(window: Any, key: Any, maximum: Any, *, task: str) -> Debounce | None:
    """``debounce`` / ``debounce_key`` / ``debounce_max`` as declared."""
    if window is None:
        if key is not None or maximum is not None:
            raise ConfigError(
                f"task {task!r}: debounce_key and debounce_max need debounce=<seconds>"
            )
        return None
    if not _seconds(window):
        raise ConfigError(f"task {task!r}: debounce is a number of seconds > 0, got {window!r}")
    if key is not None and not callable(key):
        raise ConfigError(
            f"task {task!r}: debounce_key is a callable of the task's arguments returning a "
            f"string, got {key!r}"
        )
    if maximum is None:
        maximum = DEBOUNCE_MAX_FACTOR * window
    if not _seconds(maximum) or maximum < window:
        raise ConfigError(
            f"task {task!r}: debounce_max is a number of seconds >= debounce ({window:g}), "
            f"got {maximum!r}"
        )
    return Debounce(float(window), float(maximum), key)


def fairness(key: Any, *, task: str, no_fair_queues: str | None) -> KeyFunction | None:
    """``fairness_key`` as declared; refused on a broker that cannot take a queue's jobs
    round robin (``no_fair_queues`` says why)."""
    if key is None:
        return None
    if not callable(key):
        raise ConfigError(
            f"task {task!r}: fairness_key is a callable of the task's arguments returning a "
            f"string (the tenant), e.g. lambda tenant, **_: tenant; got {key!r}"
        )
    if no_fair_queues is not None:
        raise ConfigError(
            f"task {task!r}: fairness_key needs a broker that takes a queue's jobs round robin "
            f"across keys (Redis); this one cannot: {no_fair_queues}"
        )
    function: KeyFunction = key
    return function


def key_of(
    function: KeyFunction,
    args: Any,
    kwargs: Any,
    *,
    task: str,
    option: str,
    error: type[JobsPlatformError] = ConfigError,
) -> str:
    """The key ``function`` gives the task's own arguments; ``error`` naming the task when
    it raises or returns anything but a non-empty string (a DispatchError at dispatch)."""
    try:
        key = function(*(args or ()), **(kwargs or {}))
    except Exception as exc:
        raise error(
            f"task {task!r}: {option} failed on the task's arguments: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(key, str) or not key:
        raise error(f"task {task!r}: {option} must return a non-empty str, got {key!r}")
    return key


#: The breaker's defaults (``docs/flow-control.md``): this many transient failures of the
#: downstream in a row, inside this many seconds, open it for the cool-down.
BREAKER_THRESHOLD = 5
BREAKER_WINDOW_S = 60.0
BREAKER_COOLDOWN_S = 30.0


@dataclasses.dataclass(frozen=True)
class Breaker:
    """The circuit breaker of a task's ``rate_key``: ``threshold`` transient failures in a
    row inside ``window_s`` open it; after ``cooldown_s`` one probe job closes or re-opens
    it (:mod:`jobs_platform.flow.breaker`)."""

    key: str
    threshold: int = BREAKER_THRESHOLD
    window_s: float = BREAKER_WINDOW_S
    cooldown_s: float = BREAKER_COOLDOWN_S
