"""The crash table (in the README and in docs/concepts/crash-safety.md) is what
scripts/crash_table.py makes of the committed results file (bench/crash_results.json, written
by bench/crash_sweep.py): no page shows a number the sweep did not measure (a table typed by
hand once did)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from tests.scripts import script

ROOT = Path(__file__).resolve().parent.parent.parent


def _script() -> ModuleType:
    return script("crash_table")


def test_the_readme_shows_the_table_the_results_file_makes() -> None:
    ct = _script()
    results = json.loads((ROOT / "bench" / "crash_results.json").read_text())
    want = ct.block(results)
    assert [p.relative_to(ROOT).as_posix() for p in ct.PAGES] == [
        "README.md",
        "docs/concepts/crash-safety.md",
    ]
    for page in ct.PAGES:
        assert ct.shown(page.read_text()) == want, (
            f"{page.name}'s crash table disagrees with bench/crash_results.json: "
            "run .venv/bin/python scripts/crash_table.py --write"
        )
    for key in ("lost", "duplicated", "diverged", "kills", "power_cuts", "commit"):
        assert key in results


def test_a_changed_number_is_caught() -> None:
    ct = _script()
    results = json.loads((ROOT / "bench" / "crash_results.json").read_text())
    readme = (ROOT / "README.md").read_text()
    changed = dict(results, lost=results["lost"] + 1)
    assert ct.shown(readme) != ct.block(changed)
