"""The crash-safety table (issue 47), made from the results file that the crash sweep
(``bench/crash_sweep.py``) writes, and kept in the README between its markers.

    .venv/bin/python scripts/crash_table.py            print the table
    .venv/bin/python scripts/crash_table.py --write    put it into README.md
    .venv/bin/python scripts/crash_table.py --check    exit 1 when README.md disagrees

tests/unit/test_crash_table.py runs ``--check``'s comparison: the README never shows a number
the committed results file does not hold.
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
    ap.add_argument("--write", action="store_true", help="put the table into README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 when README.md disagrees")
    ap.add_argument("--results", type=Path, default=RESULTS)
    args = ap.parse_args()
    want = block(json.loads(args.results.read_text()))
    readme = README.read_text()
    if args.write:
        old = shown(readme)
        if not old:
            sys.exit(f"{README} has no {START} … {END} markers")
        README.write_text(readme.replace(old, want))
        return
    if args.check:
        if shown(readme) != want:
            sys.exit("README.md's crash table disagrees with the results: run --write")
        return
    print(table(json.loads(args.results.read_text())))


if __name__ == "__main__":
    main()
