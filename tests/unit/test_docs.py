"""The documentation matches the code: the generated settings page, the README's shape, links."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from jobs_platform.settings import Settings, env_name, markdown_table

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
BEGIN, END = "<!-- settings:begin -->", "<!-- settings:end -->"
# [text](target) and [text](target "title"); images too. Autolinks and reference links are
# not used in these pages.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def generated_block() -> str:
    page = SETTINGS_PAGE.read_text(encoding="utf-8")
    assert page.count(BEGIN) == 1 and page.count(END) == 1, "settings markers missing/doubled"
    return page.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def table_rows(block: str) -> dict[str, list[str]]:
    """Env name -> its cells, from the Markdown table (header and rule skipped)."""
    rows: dict[str, list[str]] = {}
    for line in block.splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        rows[cells[0].strip("`")] = cells
    return rows


def test_settings_page_is_the_generated_table() -> None:
    assert generated_block() == markdown_table(), (
        "docs/settings.md is out of date: run .venv/bin/python docs/generate.py"
    )


def test_every_setting_is_on_the_page_with_its_type_unit_and_doc() -> None:
    rows = table_rows(generated_block())
    fields = dataclasses.fields(Settings)
    assert set(rows) == {env_name(f.name) for f in fields}
    for field in fields:
        assert field.metadata["unit"] and field.metadata["doc"], field.name
        _, kind, _, unit, doc = rows[env_name(field.name)]
        assert (kind, unit, doc) == (str(field.type), field.metadata["unit"], field.metadata["doc"])


@pytest.mark.parametrize("field", dataclasses.fields(Settings), ids=lambda f: f.name)
def test_each_documented_default_is_the_real_default(field: dataclasses.Field[object]) -> None:
    # Read back the way an operator would use it: the shown default, set as the
    # environment variable, must load as exactly the code's default.
    shown = table_rows(generated_block())[env_name(field.name)][2]
    raw = "" if shown == "(empty)" else shown.removeprefix("`").removesuffix("`")
    loaded = Settings.load(environ={env_name(field.name): raw})
    assert getattr(loaded, field.name) == getattr(Settings(), field.name)


def test_readme_is_a_short_front_door_opening_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    head = [line.split("#", 1)[0].strip() for line in lines[:15]]
    assert "make demo" in head and "make test" in head
    assert len(lines) <= 230, f"README.md has {len(lines)} lines; move reference text to docs/"


def doc_files() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [*pages, *sorted((ROOT / "ops" / "runbooks").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("page", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_that_exist(page: Path) -> None:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))  # code blocks hold no links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        if not linked.exists():
            broken.append(target)
            continue
        if anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files or headings {broken}"
