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


# What a provider is made of (engine/provider/): a mapping from anything to one of these is a
# per-provider table, kept in step with the others by hand, and belongs in the provider.
PROVIDER_PARTS = {
    "Backend",
    "ModelScheduler",
    "Breaker",
    "Guard",
    "SlotAffinity",
    "KvFiles",
    "Slots",
    "Capabilities",
    "Probe",
    "Health",
}
MAPPINGS = {"dict", "Dict", "Mapping", "MutableMapping", "OrderedDict", "defaultdict"}
PROVIDER_ROOM = PKG / "engine" / "provider"
CLIENTS = PKG / "backends"  # a client is one provider's already (its caches are per model)


def _per_provider_tables(tree: ast.AST) -> list[str]:
    """The annotated names in ``tree`` that map anything to a part of a provider (or to a
    pair of a loop and a lock: a lookup's lock per provider and model)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.AnnAssign):
            continue
        ann = node.annotation
        if not (isinstance(ann, ast.Subscript) and _name(ann.value) in MAPPINGS):
            continue
        value = ann.slice.elts[-1] if isinstance(ann.slice, ast.Tuple) else ann.slice
        names = {_name(n) for n in ast.walk(value)}
        if names & PROVIDER_PARTS or {"AbstractEventLoop", "Lock"} <= names:
            found.append(f"{node.lineno}: {ast.unparse(node.target)}: {ast.unparse(ann)}")
    return found


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else ""


def test_no_per_provider_table_outside_the_providers_room() -> None:
    """A provider is one object (engine/provider/): its client, slots, breakers, affinity,
    KV files, limits and capabilities live there, and nothing else in the package (but a
    client itself, per model) keeps a mapping to one of them that a reload or a provider gone
    away must empty in step."""
    tables = {
        str(path.relative_to(ROOT)): found
        for path in sources.modules()
        if PROVIDER_ROOM not in path.parents
        and CLIENTS not in path.parents
        and (found := _per_provider_tables(sources.tree(path)))
    }
    assert tables == {}


def test_the_runtime_holds_one_mapping_of_providers() -> None:
    """The runtime's mappings: its providers, and the templates it has read. (Before, seven
    dictionaries keyed by provider that ``stale`` and ``apply`` emptied in step.)"""
    tree = sources.tree(PKG / "engine" / "runtime.py")
    [runtime] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Runtime"]
    mappings = {
        ast.unparse(n.target)
        for n in runtime.body
        if isinstance(n, ast.AnnAssign)
        and isinstance(n.annotation, ast.Subscript)
        and _name(n.annotation.value) in MAPPINGS
    }
    assert mappings == {"providers", "templates"}


def test_the_table_scan_sees_a_per_provider_table() -> None:
    """The scan above can fail: the runtime's tables from before are seen."""
    before = ast.parse(
        "class Runtime:\n"
        "    backends: dict[str, Backend] = field(default_factory=dict)\n"
        "    breakers: dict[str, Breaker] = field(default_factory=dict)\n"
        "    slots_seen: dict[str, Slots] = field(default_factory=dict)\n"
        "    _cap_locks: dict[tuple[str, str], tuple[asyncio.AbstractEventLoop, asyncio.Lock]]\n"
        "    templates: dict[str, Template] = field(default_factory=dict)\n"
    )
    assert [f.split(":")[1].strip() for f in _per_provider_tables(before)] == [
        "backends",
        "breakers",
        "slots_seen",
        "_cap_locks",
    ]
