"""The crash table (in the README and in docs/concepts/crash-safety.md) is what
scripts/crash_table.py makes of the committed results file (bench/crash_results.json, written
by bench/crash_sweep.py): no page shows a number the sweep did not measure (a table typed by
hand once did)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent


def _script() -> ModuleType:
    where = ROOT / "scripts" / "crash_table.py"
    spec = importlib.util.spec_from_file_location("crash_table", where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["crash_table"] = module
    spec.loader.exec_module(module)
    return module


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
