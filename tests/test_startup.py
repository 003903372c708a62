"""Commands that start at once (issue 24): the CLI's entry point loads no module a command
does not need. A heavy module named here and found loaded after importing the entry point (in
a fresh interpreter) fails the test, so a top-level import that drags one in is caught."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

HEAVY = ("aiohttp", "mcp", "uvicorn", "starlette", "contemplation.dashboard", "xllamacpp")


def test_the_cli_entry_point_loads_no_heavy_module() -> None:
    probe = (
        "import sys, json, contemplation.cli; "
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(HEAVY)!r} "
        f"or any(m == h or m.startswith(h + '.') for h in {list(HEAVY)!r}))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []
