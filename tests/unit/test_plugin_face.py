"""The plugins' one public face: what ``contemplation.plugin`` offers is exactly its
``__all__`` (as httpx's test_exported_members keeps its own honest), each name is one thing,
and the example plugin imports nothing else of the package."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contemplation import plugin
from tests.unit import sources

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
    for node in sources.nodes(path):
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


def test_the_face_is_light() -> None:
    """A plugin author pays for the contract, not for the daemon's faces: importing
    ``contemplation.plugin`` in a fresh interpreter loads no web framework and well under 60
    of the package's modules (it loaded starlette and 53 with ``Panel`` in faces/dashboard;
    20 with the contract in its leaf, faces/card.py)."""
    probe = (
        "import contemplation.plugin, json, sys; print(json.dumps(["
        "sorted(m for m in sys.modules if m.split('.')[0] == 'contemplation'),"
        "sorted(m for m in sys.modules if m.split('.')[0] in {'starlette', 'uvicorn', 'sse_starlette'})]))"
    )
    done = subprocess.run(
        [sys.executable, "-P", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=ROOT,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT)},
    )
    ours, web = json.loads(done.stdout)
    assert web == []
    assert len(ours) <= 30, ours


def test_the_face_names_the_real_entry_point_groups() -> None:
    """Its docstring named ``contemplation.prompt.context``, a group nothing reads."""
    from contemplation import backends
    from contemplation.faces.dashboard import cards
    from contemplation.needs.tools import registry
    from contemplation.prompt import context_kinds

    real = {k.KINDS.group for k in (backends, cards, registry, context_kinds)}
    named = set(re.findall(r"``(contemplation\.[a-z.]+)``", plugin.__doc__ or ""))
    assert named == real


def test_a_dashboard_cards_former_names_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dashboard card was called a panel (a name a panel of models has alone now): a
    plugin written against ``Panel`` or the group ``contemplation.panels`` still loads."""
    from contemplation.base import plugins
    from contemplation.faces.dashboard import cards

    assert issubclass(plugin.Panel, plugin.Card) and {"Card", "Panel"} <= set(plugin.__all__)
    read: list[str] = []

    def load(group: str, kind: type, register: object) -> tuple[list[str], list[str]]:
        read.append(group)
        return [], []

    monkeypatch.setattr(plugins, "load", load)
    registry = plugins.Registry(
        cards.GROUP, plugin.Card, lambda: (), former=(cards.FORMER_GROUP,)
    )
    registry.kinds()
    assert read == ["contemplation.cards", "contemplation.panels"]
    assert cards.KINDS.former == ("contemplation.panels",)
