"""The plugins' one public face (issue 36): what ``contemplation.plugin`` offers is exactly its
``__all__`` (as httpx's test_exported_members keeps its own honest), each name is one thing,
and the example plugin imports nothing else of the package."""

from __future__ import annotations

import ast
from pathlib import Path

from contemplation import plugin

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "contemplation-echo" / "contemplation_echo"


def test_the_face_is_exactly_its_all() -> None:
    offered = {n for n in vars(plugin) if not n.startswith("_") and n != "annotations"}
    assert offered == set(plugin.__all__)
    assert len(plugin.__all__) == len(set(plugin.__all__))


def test_each_name_is_one_thing() -> None:
    """Two different classes once shared the name ``Made``: each class on the face is
    exported under its own name, and no two names are one object."""
    objects = [getattr(plugin, n) for n in plugin.__all__]
    assert len({id(o) for o in objects}) == len(objects)
    classes = {n: o for n, o in zip(plugin.__all__, objects, strict=True) if isinstance(o, type)}
    assert {n: o.__name__ for n, o in classes.items()} == {n: n for n in classes}
    assert plugin.ToolInputs is not plugin.BackendInputs


def _package_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("contemplation"):
            found.add(node.module or "")
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("contemplation")}
    return found


def test_the_example_plugin_imports_only_the_face() -> None:
    files = sorted(EXAMPLE.glob("*.py"))
    assert files
    used = set().union(*(_package_imports(f) for f in files))
    assert used == {"contemplation.plugin"}
