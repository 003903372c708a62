"""Every relative link in the README and under docs/ reaches a file, and its #anchor a heading
of that file: pages moved into docs/{guides,concepts,internals,reference}, and a link written
for the README's place breaks when its text moves into a page one folder down."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors: each heading lower-cased, punctuation dropped, spaces as hyphens."""
    found: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def broken(page: Path) -> list[str]:
    bad = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists():
            bad.append(f"{target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            bad.append(f"{target} (no such heading)")
    return bad


def test_every_relative_link_reaches_its_file_and_heading() -> None:
    found = {p.relative_to(ROOT).as_posix(): broken(p) for p in pages()}
    assert {k: v for k, v in found.items() if v} == {}


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## A heading, here\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#a-heading-here) [gone](c.md) [nohead](b.md#other) [web](https://x)\n"
    )
    assert broken(page) == ["c.md (no such file)", "b.md#other (no such heading)"]
