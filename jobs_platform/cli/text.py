"""Operator text in and message text out: what the ``dlq`` commands accept and print.

Filters (``--task``, ``--queue``, ``--fingerprint``) and justifications (``--reason``,
``--actor``) are bound parameters, so quotes and SQL meta-characters are plain text. Two
kinds of character still cannot reach the database: NUL (PostgreSQL text refuses it:
``psycopg.DataError`` and a traceback) and lone surrogates (what Python makes of bytes
that are not UTF-8 in ``argv``: ``UnicodeEncodeError`` on every database).
:func:`check_text` refuses them as a usage error when the command line is parsed; no
stored value holds either (the table strips them), so a filter with one could match
nothing anyway.

What the commands print can come from a message (a poison message's task name, its
error): :func:`printable` shows control characters as escapes (``\\x1b``), so stored
text cannot drive the operator's terminal (ESC sequences, which rich passes through),
and bidirectional overrides as ``\\u202e``, so it cannot reorder what the operator reads.
"""

from __future__ import annotations

import re
from typing import Any

import click

#: C0 but newline and tab, DEL, C1; bidi embeddings, overrides and isolates; the Unicode
#: line and paragraph separators; lone surrogates (they cannot be written to a stream).
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\ud800-\udfff"
_CONTROL = re.compile(f"[{_UNSAFE}]")
_CONTROL_OR_LINE = re.compile(f"[{_UNSAFE}\n\t]")


def text_problem(value: str, *, nul: bool = False) -> str | None:
    """Why ``value`` cannot be stored or matched, or None (``nul``: NUL is fine)."""
    if not nul and "\x00" in value:
        return "contains a NUL character, which no stored value can hold"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8 (check the terminal's or the script's encoding)"
    return None


def _check(ctx: click.Context, param: click.Parameter, value: Any, *, nul: bool) -> Any:
    values = value if isinstance(value, tuple) else (value,)
    for item in values:
        if isinstance(item, str):
            problem = text_problem(item, nul=nul)
            if problem is not None:
                raise click.BadParameter(problem, ctx=ctx, param=param)
    return value


def check_text(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """A click callback: ``value`` as given, or a usage error (exit 2) naming the option."""
    return _check(ctx, param, value, nul=False)


def check_utf8(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """:func:`check_text` for text that goes to Redis, which stores NUL but only as UTF-8
    (``delayed``: redis-py cannot encode a lone surrogate)."""
    return _check(ctx, param, value, nul=True)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: str, *, multiline: bool = True) -> str:
    """``text`` with control characters shown as ``\\xNN`` (``\\uNNNN`` above 0xFF).

    Newline and tab are kept when ``multiline`` (a traceback, a message shown whole);
    a one-line value (a table cell, a task name) escapes them too, so stored text cannot
    fake a line or a row of its own.
    """
    return (_CONTROL if multiline else _CONTROL_OR_LINE).sub(_escape, text)
