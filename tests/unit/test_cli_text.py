"""What the dlq commands accept and print (jobs_platform.cli.text)."""

from __future__ import annotations

import re
import unicodedata

import click
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from jobs_platform.cli.text import check_text, check_utf8, printable, text_problem


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("x\x00y", "NUL"),
        ("caf\udce9", "not valid UTF-8"),  # how Python shows argv bytes that are not UTF-8
        ("x'; DROP TABLE dead_letter_jobs; --", None),
        ("名前\U0001f4a5\r\n\t", None),
        ("", None),
    ],
)
def test_only_text_no_database_can_hold_is_refused(value: str, problem: str | None) -> None:
    found = text_problem(value)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_check_text_is_a_usage_error_naming_the_option() -> None:
    @click.command()
    @click.option("--task", callback=check_text)
    @click.option("--tag", multiple=True, callback=check_text)
    def command(task: str | None, tag: tuple[str, ...]) -> None:
        click.echo(f"{task}|{','.join(tag)}")

    runner = CliRunner()
    assert runner.invoke(command, ["--task=a'b", "--tag=x", "--tag=y"]).output == "a'b|x,y\n"
    assert runner.invoke(command, []).output == "None|\n"
    for args in (["--task=a\x00b"], ["--tag=ok", "--tag=\udcff"]):
        done = runner.invoke(command, args)
        assert done.exit_code == 2
        assert ("--task" in done.output) or ("--tag" in done.output)


def test_printable_shows_control_characters_as_escapes() -> None:
    assert printable("a\x1b[31mred\x07\x00\x9b") == "a\\x1b[31mred\\x07\\x00\\x9b"
    assert printable("line\nnext\ttab é 名前") == "line\nnext\ttab é 名前"


@given(st.text())
def test_printable_output_holds_no_control_character_but_newline_and_tab(text: str) -> None:
    shown = printable(text)
    assert all(c in "\n\t" or not (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F) for c in shown)


def test_check_utf8_lets_nul_through_for_redis_but_not_surrogates() -> None:
    @click.command()
    @click.argument("task_id", callback=check_utf8)
    def command(task_id: str) -> None:
        click.echo(repr(task_id))

    runner = CliRunner()
    assert runner.invoke(command, ["a\x00b"]).output == "'a\\x00b'\n"
    done = runner.invoke(command, ["caf\udce9"])
    assert done.exit_code == 2 and "TASK_ID" in done.output and "UTF-8" in done.output


def test_one_line_values_cannot_break_their_line_or_reorder_text() -> None:
    assert printable("a\nb\tc\r", multiline=False) == "a\\x0ab\\x09c\\x0d"
    assert (
        printable("exe.\u202etxt \u2066x\u2069 \u2028") == "exe.\\u202etxt \\u2066x\\u2069 \\u2028"
    )
    assert printable("\udcff") == "\\udcff"  # a lone surrogate cannot even be written out


BIDI_CONTROLS = ("LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI")
_ESCAPE = re.compile(r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})")


def unescape(shown: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m[1] or m[2], 16)), shown)


@given(st.text().filter(lambda t: "\\" not in t), st.booleans())
def test_printable_loses_nothing_it_only_escapes(text: str, multiline: bool) -> None:
    shown = printable(text, multiline=multiline)
    assert unescape(shown) == text
    kept = "\n\t" if multiline else ""
    # No control (Cc), no surrogate (Cs), no bidi override or line separator is left.
    assert not any(
        (unicodedata.category(c) in ("Cc", "Cs") and c not in kept)
        or unicodedata.bidirectional(c) in BIDI_CONTROLS
        or c in "\u2028\u2029"
        for c in shown
    )


@given(st.text())
def test_check_text_refuses_exactly_what_a_database_cannot_hold(text: str) -> None:
    @click.command()
    @click.option("--task", callback=check_text)
    def command(task: str) -> None:
        assert task == text  # accepted: passed on unchanged

    done = CliRunner().invoke(command, [f"--task={text}"])
    storable = "\x00" not in text and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)
    assert done.exit_code == (0 if storable else 2), (done.output, done.exception)
