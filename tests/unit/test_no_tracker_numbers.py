"""No tracker numbers in the code, the tests, the scripts, the benchmarks or the docs: a
comment that gave a tracker's number in parentheses meant nothing to a reader of the
repository; it names the finding it stands for instead."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PLACES = ("contemplation", "tests", "scripts", "bench", "docs", "examples", "service")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".json", ".yml", ".yaml", ".txt", ".html", ".js"}
#: the word, then a number: singular or plural, any case, with or without "#"
TRACKER = re.compile(r"\bissues? ?#?\d+", re.I)


def files() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for place in PLACES:
        for path in sorted((ROOT / place).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                found.append(path)
    return found


def references(text: str) -> list[str]:
    return [m.group(0) for m in TRACKER.finditer(text)]


def test_no_file_names_a_tracker_number() -> None:
    found = {}
    for path in files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # a binary file, or one removed while the tree is walked
        for n, line in enumerate(text.splitlines(), 1):
            if references(line):
                found[f"{path.relative_to(ROOT)}:{n}"] = line.strip()[:120]
    assert found == {}, "name the finding instead of its tracker number:\n" + "\n".join(
        f"{k}: {v}" for k, v in found.items()
    )


def test_a_tracker_number_is_caught() -> None:
    said = "the ledger (" + "issue" + " 39), " + "Issues" + " 34 and 35, " + "issue" + " #12"
    assert len(references(said)) == 3
    assert references("an issue with 3 tiers, the 2 issues left, a tis" + "sue 4") == []
