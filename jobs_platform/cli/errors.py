"""A ConfigError or DispatchError at the ``celery`` command line: one short message, exit 1.

The platform's messages already say what is wrong, which setting, and what to do; Celery
buries them. It loads ``-A APP`` inside its group callback and turns any exception there
into a usage error followed by the whole traceback ("Unable to load celery application",
50 to 100 lines); an error raised later, inside a command (a worker's start-up check, a
``dlq`` or ``db`` command), reaches Python's top level as a traceback too.

:func:`install` runs while Celery's CLI loads the platform's commands (the
``celery.commands`` entry points import this package, before any command runs). It wraps
Celery's app loading (``celery.bin.celery.find_app``: Celery has no public hook there, see
:mod:`jobs_platform.internals`) and chains ``sys.excepthook`` (Python's public one) for
the rest. Either prints ``Error: <message>`` and a hint on stderr and exits 1; every other
exception is left to Celery and Python as before. ``JOBS_CLI_TRACEBACK=1`` shows the
traceback instead.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any

from jobs_platform.env import env_name
from jobs_platform.errors import ConfigError, DispatchError

#: The errors whose message is the whole story (the rest keep their traceback).
CLEAN = (ConfigError, DispatchError)
TRACEBACK_ENV = env_name("cli_traceback")
_MARK = "_jobs_platform_clean_errors"


def wants_traceback(environ: Any = os.environ) -> bool:
    return str(environ.get(TRACEBACK_ENV, "")).strip().lower() in {"1", "true", "yes", "on"}


def short(exc: BaseException, while_: str = "") -> str:
    """The lines printed instead of a traceback."""
    where = f" while {while_}" if while_ else ""
    return f"Error: {exc}\n({type(exc).__name__}{where}; {TRACEBACK_ENV}=1 shows the traceback)"


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def clean_loading(find_app: Callable[..., Any]) -> Callable[..., Any]:
    """``find_app`` exiting with :func:`short` on a platform error raised while loading."""

    @functools.wraps(find_app)  # its signature stays readable (internals.py checks it)
    def find(app: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return find_app(app, *args, **kwargs)
        except CLEAN as exc:
            _say(short(exc, f"loading {app}"))
            raise SystemExit(1) from None  # not an Exception: Celery's handler lets it by

    setattr(find, _MARK, True)
    return find


def clean_excepthook(previous: Callable[..., Any]) -> Callable[..., Any]:
    """``sys.excepthook`` printing :func:`short` for a platform error, else ``previous``."""

    @functools.wraps(previous)
    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> Any:
        if isinstance(exc, CLEAN):
            _say(short(exc))
            return None
        return previous(kind, exc, tb)

    setattr(hook, _MARK, True)
    return hook


def install() -> None:
    """Clean errors for this ``celery`` command (only while Celery's CLI is loading its
    plugins: importing the platform's commands anywhere else changes nothing)."""
    module = sys.modules.get("celery.bin.celery")
    loading_plugins = module is not None and not hasattr(module, "main")
    if not loading_plugins or wants_traceback():
        return
    if not getattr(module.find_app, _MARK, False):  # type: ignore[union-attr]
        module.find_app = clean_loading(module.find_app)  # type: ignore[union-attr]
    if not getattr(sys.excepthook, _MARK, False):
        sys.excepthook = clean_excepthook(sys.excepthook)
