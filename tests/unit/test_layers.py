"""The package's layering, as a test: rooms import only downward and in no circle,
the faces reach neither the engine nor the daemon (but the ``run`` command, which starts one),
and only the writer renames, unlinks, removes or writes files under the home.

The measure is scripts/architecture.py's, the one docs/internals/architecture.md and the closing notes quote."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

from tests.scripts import script
from tests.unit import sources

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "contemplation"


def _architecture() -> ModuleType:
    return script("architecture")


arch = _architecture()
MODULES: dict[str, Path] = arch.modules(ROOT)
GRAPH = {m: arch.imports(p, set(MODULES)) for m, p in MODULES.items()}

# The run command starts the daemon; it is the one face that may import it.
RUN_COMMAND = "faces.cli.daemon"
# Writes that are not the home's: the service's unit files (in the user's config), the Claude
# plugin's marketplace and the Desktop bundle (where the user points), and the index's own
# sqlite files, which sqlite writes and the index alone removes when corrupt.
WRITES_ELSEWHERE = {"faces/service.py", "faces/claude.py", "index/db.py"}


def test_every_module_has_a_room_and_the_rooms_are_the_folders() -> None:
    rooms = {name for _, names in arch.LAYERS for name in names}
    tops = {p.name.removesuffix(".py") for p in PKG.iterdir() if not p.name.startswith(("_", "."))}
    data = {"skeleton", "service_templates", "py.typed"}
    assert tops - data - {"plugin"} == rooms, "a folder without a layer, or a layer without one"
    for m in MODULES:
        assert arch.layer(m) < arch.PLUGIN or m in {"plugin", "__init__", "__main__"}, m


def test_no_arrow_goes_up_and_no_circle() -> None:
    up = [
        (m, t)
        for m, targets in GRAPH.items()
        for t in targets
        if arch.layer(t) > arch.layer(m) and m not in {"__init__", "__main__"}
    ]
    assert up == []
    rooms: dict[str, set[str]] = {}
    for m, targets in GRAPH.items():
        rooms.setdefault(m.split(".")[0], set()).update(t.split(".")[0] for t in targets)
    for r, targets in rooms.items():
        targets.discard(r)
    assert arch.circles(GRAPH) == []
    assert arch.circles(rooms) == []


def test_nothing_inside_imports_the_plugins_face() -> None:
    assert [m for m, targets in GRAPH.items() if "plugin" in targets] == []


def test_the_faces_reach_neither_engine_nor_daemon_but_the_run_command() -> None:
    reach = sorted(
        (m, t)
        for m, targets in GRAPH.items()
        if m.startswith("faces.") and m != RUN_COMMAND
        for t in targets
        if t.split(".")[0] in {"engine", "daemon"}
    )
    assert reach == []


_CALLS = {("os", "rename"), ("os", "replace"), ("os", "unlink"), ("os", "remove"),
          ("os", "rmdir"), ("os", "truncate"), ("shutil", "rmtree"), ("shutil", "move")}  # fmt: skip
_METHODS = {"unlink", "rmdir", "write_text", "write_bytes", "touch", "rename"}


def _writes(path: Path) -> list[str]:
    found = []
    for node in sources.nodes(path):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute):
            if isinstance(f.value, ast.Name) and (f.value.id, f.attr) in _CALLS:
                found.append(f"{node.lineno}: {f.value.id}.{f.attr}")
            elif f.attr in _METHODS:
                found.append(f"{node.lineno}: .{f.attr}()")
        elif isinstance(f, ast.Name) and f.id == "open" and len(node.args) > 1:
            mode = node.args[1]
            if isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax+"):
                found.append(f"{node.lineno}: open({mode.value!r})")
    return found


def test_only_the_writer_changes_files() -> None:
    writes = {
        str(p.relative_to(PKG)): w
        for p in sources.modules()
        if p.relative_to(PKG).parts[0] != "writer"
        and str(p.relative_to(PKG)) not in WRITES_ELSEWHERE
        and (w := _writes(p))
    }
    assert writes == {}


def test_the_scan_sees_a_write(tmp_path: Path) -> None:
    """The check above can fail: a module that writes is seen."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nos.rename('a', 'b')\nopen('x', 'w')\nprobe.unlink()\n")
    assert [w.split(": ")[1] for w in _writes(probe)] == ["os.rename", "open('w')", ".unlink()"]


# The turn's room: its phases in the order they may import each other
TURN_CHAIN = ["state", "retrying", "prepare", "fit", "ahead", "stream", "end", "run"]


def test_the_turns_phases_are_a_chain_and_its_room_has_two_doors() -> None:
    """Inside engine/turn/ a phase imports only the ones before it (no circle, no phase
    calling back); outside it only the chain's start (run) and the state are imported, and
    the sub-rooms of the engine (the turn as one) import each other in no circle."""
    prefix = "engine.turn."
    inside = {
        m.removeprefix(prefix): {t.removeprefix(prefix) for t in ts if t.startswith(prefix)}
        for m, ts in GRAPH.items()
        if m.startswith(prefix)
    }
    assert set(inside) == set(TURN_CHAIN)
    back = [
        (m, t) for m, ts in inside.items() for t in ts if TURN_CHAIN.index(t) >= TURN_CHAIN.index(m)
    ]
    assert back == []
    doors = {
        t for m, ts in GRAPH.items() if not m.startswith(prefix) for t in ts if t.startswith(prefix)
    }
    assert doors <= {"engine.turn.run", "engine.turn.state"}
    sub: dict[str, set[str]] = {}
    for m, ts in GRAPH.items():
        if m.startswith("engine."):
            room = "engine.turn" if m.startswith(prefix) else m
            sub.setdefault(room, set()).update(
                "engine.turn" if t.startswith(prefix) else t for t in ts if t.startswith("engine.")
            )
    for r, ts in sub.items():
        ts.discard(r)
    assert arch.circles(sub) == []


def test_the_providers_room_has_one_door_and_sits_below_the_turn() -> None:
    """A provider is one object (engine/provider/): outside its room only the room itself
    (``Provider``, ``Health``) is imported, and the room imports neither the runtime nor the
    turn (they ask it; it never asks them)."""
    prefix = "engine.provider"
    doors = {
        t
        for m, ts in GRAPH.items()
        if not m.startswith(prefix)
        for t in ts
        if t.startswith(prefix + ".")
    }
    assert doors == set()
    up = {
        (m, t)
        for m, ts in GRAPH.items()
        if m.startswith(prefix)
        for t in ts
        if t == "engine.runtime" or t.startswith(("engine.turn", "engine.pipeline"))
    }
    assert up == set()
