"""The code's shape, read from the source: no engine function takes 7 or more
parameters (the turn travels as one object), no function in the package runs over 120 lines,
no import brings back a module name from before the rooms move, each room says in its first
line what lives there, and each unit-test file that names a module sits in that module's
room."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.unit import sources

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "contemplation"
UNIT = ROOT / "tests" / "unit"

MAX_PARAMETERS = 6  # an engine function with more is carrying a turn in loose pieces
MAX_LINES = 120

# The flat modules' names before the rooms move (eb7304e^), that an alias brought back
PRE_MOVE = {
    "index_db",
    "index_rows",
    "index_keeper",
    "search_index",
    "search_query",
    "mcp_server",
    "mcp_arguments",
    "mcp_faces",
    "mcp_tasks",
    "mcp_subscriptions",
    "plugin_probe",
    "cli_wait",
    "cli_common",
    "settings_mod",
}


def _functions(root: Path) -> Iterator[tuple[Path, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for path in sorted(root.rglob("*.py")):
        for node in sources.nodes(path):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield path, node


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def test_no_engine_function_takes_seven_parameters() -> None:
    wide = [
        f"{p.relative_to(ROOT)}:{fn.name} ({len(_parameters(fn))})"
        for p, fn in _functions(PKG / "engine")
        if len(_parameters(fn)) > MAX_PARAMETERS
    ]
    assert wide == []


def test_no_function_runs_over_120_lines() -> None:
    long = [
        f"{p.relative_to(ROOT)}:{fn.name} ({(fn.end_lineno or fn.lineno) - fn.lineno + 1})"
        for p, fn in _functions(PKG)
        if (fn.end_lineno or fn.lineno) - fn.lineno + 1 > MAX_LINES
    ]
    assert long == []


def test_no_import_brings_back_a_pre_move_name() -> None:
    aliased = [
        f"{p.relative_to(ROOT)}:{node.lineno} {a.name} as {a.asname}"
        for p in sources.modules()
        for node in sources.nodes(p)
        if isinstance(node, ast.ImportFrom | ast.Import)
        for a in node.names
        if a.asname in PRE_MOVE
    ]
    assert aliased == []


def test_each_room_says_what_lives_there() -> None:
    silent = []
    for init in sorted(PKG.rglob("__init__.py")):
        doc = ast.get_docstring(sources.tree(init))
        if not doc or not doc.splitlines()[0].strip():
            silent.append(str(init.relative_to(ROOT)))
    assert silent == []


def test_each_unit_test_sits_in_its_modules_room() -> None:
    """``tests/unit/<room>/test_<name>.py`` where ``<name>`` is one module of the package:
    the room is that module's (a test of several rooms sits in tests/unit itself)."""
    modules: dict[str, set[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if len(rel.parts) > 1:
            modules.setdefault(path.stem, set()).add(rel.parts[0])
    misplaced = []
    for test in sorted(UNIT.rglob("test_*.py")):
        rooms = modules.get(test.stem.removeprefix("test_"), set())
        where = test.relative_to(UNIT).parts
        if len(rooms) == 1 and (len(where) == 1 or where[0] not in rooms):
            misplaced.append(f"{test.relative_to(ROOT)} (its module is in {rooms.pop()}/)")
    assert misplaced == []
