"""The README stays a front door: at most 300 lines (it had grown to 1,432, a user guide, a
reference and an evidence file at once), exactly the two set-up commands, and every page
under docs/ reachable from the docs index."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(README.read_text().splitlines()) <= 300


def test_the_readme_sets_up_with_exactly_two_commands() -> None:
    text = README.read_text()
    table = text.split("## Set up on a fresh machine", 1)[1].split("\n\n", 2)[1]
    commands = re.findall(r"\| `([^`]+)` \|$", table, re.M)
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]


def test_every_docs_page_is_in_the_index() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    linked = {(ROOT / "docs" / m).resolve() for m in re.findall(r"\]\(([^)#\s]+)", index)}
    pages = {p.resolve() for p in (ROOT / "docs").rglob("*.md") if p.name != "README.md"}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - linked)
    assert missing == [], f"add these pages to docs/README.md: {missing}"
