"""Rewrite the generated settings table in docs/settings.md from the code.

Run after adding or changing a setting: ``.venv/bin/python docs/generate.py``.
Only the block between the marker comments is replaced; the prose around it is kept.
``--check`` changes nothing and exits 1 if the page is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

from jobs_platform.settings import markdown_table

PAGE = Path(__file__).resolve().parent / "settings.md"
BEGIN = "<!-- settings:begin -->"
END = "<!-- settings:end -->"


def render(page: str) -> str:
    """``page`` with the text between the markers replaced by the current table."""
    head, found_begin, rest = page.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not (found_begin and found_end):
        raise SystemExit(f"{PAGE}: markers {BEGIN} / {END} not found")
    # Blank lines around the table so no Markdown renderer folds a marker into it.
    return f"{head}{BEGIN}\n\n{markdown_table()}\n\n{END}{tail}"


def main(argv: list[str]) -> int:
    current = PAGE.read_text(encoding="utf-8")
    wanted = render(current)
    if "--check" in argv:
        if current != wanted:
            print(f"{PAGE} is out of date: run .venv/bin/python docs/generate.py", file=sys.stderr)
            return 1
        return 0
    if current != wanted:
        PAGE.write_text(wanted, encoding="utf-8")
        print(f"rewrote the settings table in {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
