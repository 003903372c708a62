"""The README's crash table is what scripts/crash_table.py makes of the committed results
file (bench/crash_results.json, written by bench/crash_sweep.py): it never shows a number
the sweep did not measure (issue 47)."""

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
    assert ct.shown((ROOT / "README.md").read_text()) == want, (
        "README.md's crash table disagrees with bench/crash_results.json: "
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
