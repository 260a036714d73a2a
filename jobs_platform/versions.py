"""Payload versions: what a worker does with a job dispatched by other code (pure: no Celery).

A task declares ``version=N`` (default 1) and ``upcast={1: f, 2: g, ...}``, where
``upcast[k](args, kwargs)`` returns the ``(args, kwargs)`` of version ``k + 1``. Every
message carries the version of the code that dispatched it (:data:`VERSION_HEADER`; a
message without one predates versions and is version 1). Before the body runs,
:func:`screen` decides:

- same version: run as sent;
- older: run the upcasters in order, then run;
- newer (a new producer, an old worker, mid-deploy): never run on this code; defer (no
  attempt burned) until upgraded workers take it, for at most ``JOBS_VERSION_SKEW_WINDOW``
  counted from the first deferral (:data:`WAIT_HEADER`), then dead-letter ``version_skew``;
- arguments that do not bind to the current signature (the signature changed without a
  version bump), or an upcaster that fails: dead-letter ``version_skew``, no retry.

The same fit (:func:`fit`: upcast, then bind) is what a dead-letter replay checks before it
sends a row, dry run included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jobs_platform import history
from jobs_platform.clock import unix_time
from jobs_platform.errors import PermanentError

VERSION_HEADER = history.VERSION_HEADER
WAIT_HEADER = history.VERSION_WAIT_HEADER
#: A deferred too-new job looks again after a tenth of the window, within these bounds (s).
MIN_RECHECK_S = 1.0
MAX_RECHECK_S = 30.0

Upcaster = Callable[[Any, Any], Any]
#: Binds ``(*args, **kwargs)`` to the task's signature; raises TypeError when they do not fit.
Bind = Callable[..., Any]


class VersionSkew(PermanentError):
    """The job's payload does not fit this worker's code: dead-lettered ``version_skew``."""


@dataclasses.dataclass(frozen=True)
class Versions:
    """A task's payload version and the upcasters from each older one."""

    version: int = 1
    upcast: Mapping[int, Upcaster] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Run:
    """Run the body with these (current-version) arguments."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Defer:
    """Publish the job again in ``wait_s`` seconds, with these headers (the wait's start)."""

    wait_s: float
    headers: dict[str, Any]
    payload_version: int


Screened = Run | Defer


def version_of(headers: Mapping[str, Any] | None) -> int:
    """The payload version a message carries (1 without the header); VersionSkew when the
    header holds something that is not a version."""
    value = (headers or {}).get(VERSION_HEADER, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise VersionSkew(f"the message's {VERSION_HEADER} header is {value!r}, not a version")
    return value


def upcast(
    task: str, versions: Versions, from_version: int, args: Any, kwargs: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of ``from_version`` brought to ``versions.version`` through the
    upcasters in order; VersionSkew naming the upcaster that failed or returned no pair."""
    current_args: Any = tuple(args or ())
    current_kwargs: Any = dict(kwargs or {})
    for step in range(from_version, versions.version):
        try:
            out = versions.upcast[step](current_args, current_kwargs)
        except Exception as exc:
            raise VersionSkew(
                f"{task}: upcast[{step}] (version {step} -> {step + 1}) failed on the payload "
                f"of version {from_version}: {type(exc).__name__}: {exc}"
            ) from exc
        if (
            not isinstance(out, list | tuple)
            or len(out) != 2
            or not isinstance(out[0], list | tuple)
            or not isinstance(out[1], Mapping)
        ):
            raise VersionSkew(
                f"{task}: upcast[{step}] must return (args, kwargs), a sequence and a mapping; "
                f"got {out!r:.80}"
            )
        current_args, current_kwargs = tuple(out[0]), dict(out[1])
    return current_args, current_kwargs


def fit(
    task: str, versions: Versions, payload_version: int, args: Any, kwargs: Any, bind: Bind
) -> Run:
    """The arguments the body of the current version runs with: upcast, then bound to the
    signature. VersionSkew (naming the task and both versions) when the payload is newer
    than the code or does not bind."""
    if payload_version > versions.version:
        raise VersionSkew(
            f"{task}: payload of version {payload_version} is newer than this code's version "
            f"{versions.version}; run it on the upgraded code"
        )
    new_args, new_kwargs = upcast(task, versions, payload_version, args, kwargs)
    try:
        bind(*new_args, **new_kwargs)
    except TypeError as exc:
        upcasted = "" if payload_version == versions.version else " (upcast)"
        raise VersionSkew(
            f"{task}: payload of version {payload_version}{upcasted} does not fit the signature "
            f"of version {versions.version} (TypeError: {exc}); the signature changed without a "
            "version bump? declare version= and upcast="
        ) from exc
    return Run(new_args, new_kwargs)


def recheck_s(window_s: float) -> float:
    """How long a too-new job waits between two looks."""
    return min(MAX_RECHECK_S, max(MIN_RECHECK_S, window_s / 10.0))


def screen(
    task: str,
    versions: Versions,
    headers: Mapping[str, Any] | None,
    args: Any,
    kwargs: Any,
    *,
    bind: Bind,
    now_s: float,
    window_s: float,
    stamp: str,
) -> Screened:
    """What to do with a delivery before the body runs (see the module docstring).

    ``now_s``: the current Unix time; ``stamp``: the same moment as the ISO string a wait
    starts at; ``window_s``: ``JOBS_VERSION_SKEW_WINDOW``. Raises VersionSkew to dead-letter.
    """
    payload_version = version_of(headers)
    if payload_version <= versions.version:
        return fit(task, versions, payload_version, args, kwargs, bind)
    started = _wait_started(headers)
    waited_s = 0.0 if started is None else max(0.0, now_s - started)
    if waited_s >= window_s:
        raise VersionSkew(
            f"{task}: payload of version {payload_version} is newer than this worker's version "
            f"{versions.version}; no upgraded worker took it within {window_s:g} s "
            "(JOBS_VERSION_SKEW_WINDOW); replay it once the deploy is done"
        )
    new_headers = dict(headers or {})
    if started is None:
        new_headers[WAIT_HEADER] = stamp
    wait_s = min(recheck_s(window_s), window_s - waited_s)
    return Defer(wait_s, new_headers, payload_version)


def _wait_started(headers: Mapping[str, Any] | None) -> float | None:
    value = (headers or {}).get(WAIT_HEADER)
    return unix_time(value) if isinstance(value, str) else None
