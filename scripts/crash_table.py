"""The crash-safety table, made from the results file that the crash sweep
(``bench/crash_sweep.py``) writes, and kept between its markers in the README and in
docs/concepts/crash-safety.md (a table typed by hand once showed figures no sweep had made).

    .venv/bin/python scripts/crash_table.py            print the table
    .venv/bin/python scripts/crash_table.py --write    put it into both pages
    .venv/bin/python scripts/crash_table.py --check    exit 1 when a page disagrees

tests/unit/test_crash_table.py runs ``--check``'s comparison: no page shows a number the
committed results file does not hold.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "crash_results.json"
README = ROOT / "README.md"
PAGES = (README, ROOT / "docs" / "concepts" / "crash-safety.md")
START = "<!-- crash-table:start (scripts/crash_table.py --write) -->"
END = "<!-- crash-table:end -->"


def table(results: dict[str, Any]) -> str:
    """The Markdown table for ``results`` (what ``bench/crash_sweep.py`` wrote)."""
    rows = [
        ("scenarios", ", ".join(results["scenarios"])),
        ("crash points reached", f"{len(results['crash_points'])}: "
         + ", ".join(results["crash_points"])),
        ("kills (SIGKILL at a point)", str(results["kills"])),
        ("power cuts at a point (only what was fsynced survives)", str(results["power_cuts"])),
        ("power cuts between two fsyncs (after each durable call of a step)",
         str(results.get("power_cuts_between_fsyncs", 0))),
        ("acknowledged messages lost", str(results["lost"])),
        ("duplicated (a message twice, two whole replies, a whole reply asked again)",
         str(results["duplicated"])),
        ("diverged (state, folders or replies out of place)", str(results["diverged"])),
        ("commit", f"`{results['commit']}`"),
    ]  # fmt: skip
    lines = ["| crash sweep | |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    return "\n".join(lines)


def block(results: dict[str, Any]) -> str:
    return f"{START}\n{table(results)}\n{END}"


def shown(readme: str) -> str:
    """The block between the markers as the README has it ("" when it has none)."""
    at, end = readme.find(START), readme.find(END)
    if at < 0 or end < at:
        return ""
    return readme[at : end + len(END)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="put the table into both pages")
    ap.add_argument("--check", action="store_true", help="exit 1 when a page disagrees")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    want = block(json.loads(args.results.read_text()))
    for page in PAGES:
        text = page.read_text()
        if args.write:
            old = shown(text)
            if not old:
                sys.exit(f"{page} has no {START} … {END} markers")
            page.write_text(text.replace(old, want))
        elif args.check and shown(text) != want:
            sys.exit(f"{page.name}'s crash table disagrees with the results: run --write")
    if args.write or args.check:
        return
    print(table(json.loads(args.results.read_text())))


if __name__ == "__main__":
    main()
