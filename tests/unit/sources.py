"""The package's modules read and parsed once per test run: the shape, layering and one-owner
tests each walk all of them, and parsing ~200 modules again in each was seconds of CPU every
run. The trees are shared: a test reads them, never changes them."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "contemplation"


@cache
def modules() -> tuple[Path, ...]:
    """The package's modules, in order."""
    return tuple(sorted(PKG.rglob("*.py")))


@cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@cache
def nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of the module, as ``ast.walk`` yields them."""
    return tuple(ast.walk(tree(path)))
