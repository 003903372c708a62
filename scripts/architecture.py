"""The shape of the package, measured: import arrows that go up the layers, import circles,
the largest modules, and the module boundaries one message crosses on its way.

    .venv/bin/python scripts/architecture.py [--tree DIR]   (DIR: a checkout; default: here)

Layers, lowest first: the package's folders (rooms) and its few top-level modules, in the
order of the code map (docs/internals/architecture.md). A module may import its own room
and those below; an import of a higher room is an arrow up. ``plugin`` (the plugins' public
face) sits above all and nothing inside imports it. tests/unit/test_layers.py holds these
rules as tests.

    0 errors models   1 base   2 protocol   3 settings   4 store   5 writer   6 backends
    7 index   8 needs (with tools/)   9 prompt   10 config   11 engine   12 daemon   13 faces
    14 plugin

Imports under ``if TYPE_CHECKING:`` are not counted (they never run). A function-level import
is counted (it runs). The message path is traced with ``sys.setprofile`` while a message is
answered by an in-process backend: every call from one contemplation module into another is
a crossing, and so is each resumption of a coroutine that waited (it re-enters every frame
of its chain). The figure quoted is a warm message, as the daemon handles it (see
:func:`trace_path`); the first message of a ``run --once`` is printed after it.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (0, ("errors", "values", "models")),
    (1, ("base",)),
    (2, ("protocol",)),
    (3, ("settings",)),
    (4, ("store",)),
    (5, ("writer",)),
    (6, ("backends",)),
    (7, ("index",)),
    (8, ("needs",)),
    (9, ("prompt",)),
    (10, ("config",)),
    (11, ("engine",)),
    (12, ("daemon",)),
    (13, ("faces",)),
]  # fmt: skip
PLUGIN = 14  # the plugins' public face: above everything, imported by nothing inside


def layer(module: str) -> int:
    """``module`` without the package prefix (``writer.session``)."""
    head = module.split(".", maxsplit=1)[0]
    for n, names in LAYERS:
        if head in names:
            return n
    return PLUGIN


def modules(root: Path) -> dict[str, Path]:
    pkg = root / "contemplation"
    out: dict[str, Path] = {}
    for f in sorted(pkg.rglob("*.py")):
        rel = f.relative_to(pkg).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        out[".".join(parts) or "__init__"] = f
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules ``path`` imports when it runs (TYPE_CHECKING blocks left out)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.startswith("contemplation"):
                base = node.module.removeprefix("contemplation").lstrip(".")
                for alias in node.names:
                    full = f"{base}.{alias.name}" if base else alias.name
                    found.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("contemplation."):
                    found.add(alias.name.removeprefix("contemplation."))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def trace_path(root: Path, *, verbose: bool = False) -> dict[str, tuple[int, int]]:
    """(distinct module-to-module edges, calls across modules) of two messages, by name:

    ``warm``: a message in a conversation the daemon has answered before, handled as the
    daemon handles it: the runtime built as it builds it (the NEED router made at start) and
    one memory of the conversations (``Tracked``) kept between messages, each message
    dispatched through ``process_safely``. The steady state, and the figure quoted.

    ``first``: the first message of a new conversation, as ``run --once`` answers it (the
    same runtime; ``process_pending``, a new memory each run): the conversation's first
    look (its recovery scan) and its template's first reading are in it.

    Both runtimes are made by ``build_runtime``, as ``serve`` and ``run --once`` make theirs.
    """
    code = r"""
import asyncio, sys, tempfile
from collections import defaultdict
from pathlib import Path
sys.path.insert(0, ".")
from bench.bench_foundation import InstantBackend
from contemplation.store.layout import Home
from contemplation.engine.pipeline import Runtime, process_pending, process_safely
from contemplation.engine.tracking import Tracked
from contemplation.settings import load
from contemplation.writer import drop_message, new_conversation
from contemplation.store.templates import load_template
try:
    from contemplation.daemon.root import build_runtime
except ImportError:  # (a tree from before)
    build_runtime = None
pkg = str(Path("contemplation").resolve())
def mod(f):
    if not f.startswith(pkg):
        return None
    return f[len(pkg) + 1:-3].replace("/", ".").removesuffix(".__init__")
def traced(run):
    edges = defaultdict(int)
    def prof(frame, event, arg):
        if event != "call":
            return
        callee = mod(frame.f_code.co_filename)
        caller = frame.f_back and mod(frame.f_back.f_code.co_filename)
        if callee and caller and callee != caller:
            edges[(caller, callee)] += 1
    sys.setprofile(prof)
    try:
        asyncio.run(run())
    finally:
        sys.setprofile(None)
    return edges
def runtime(name):
    home = Home(Path(tempfile.mkdtemp()) / "home")
    s = load(overrides={"home": str(home.root), "settle_seconds": 0, "durability": "none"})
    rt = build_runtime(s) if build_runtime else Runtime(settings=s, home=home)
    rt.provider("ollama").use(InstantBackend())
    tpl = load_template(home, "default")
    conv = new_conversation(home, name, template=tpl, model="m", backend="ollama")
    return rt, conv
def replies(conv):
    return conv.log.read_text().count("OLLAMA -> CLAUDE")
# first: run --once in a new conversation, after a run that found nothing to do (first in
# this process: nothing is cached yet but the imports)
rt, conv = runtime("first")
asyncio.run(process_pending(rt))
drop_message(conv, "hello")
first = traced(lambda: process_pending(rt))
assert replies(conv) == 1 and "hello" in conv.log.read_text()
# warm: the daemon's memory; a conversation's first message answered, the
# second traced
rt, conv = runtime("warm")
seen = Tracked()
drop_message(conv, "first")
asyncio.run(process_safely(conv, rt, seen))
assert replies(conv) == 1
drop_message(conv, "hello")
warm = traced(lambda: process_safely(conv, rt, seen))
assert replies(conv) == 2 and "hello" in conv.log.read_text()
for name, edges in (("warm", warm), ("first", first)):
    print(name, len(edges), sum(edges.values()))
    for (a, b), n in sorted(edges.items()):
        print(f"{name}: {a} -> {b} {n}", file=sys.stderr)
"""
    got = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=False
    )
    if got.returncode != 0:
        raise SystemExit(f"the trace failed in {root}:\n{got.stderr[-2000:]}")
    if verbose:
        print(got.stderr, end="")
    out: dict[str, tuple[int, int]] = {}
    for line in got.stdout.splitlines():
        name, a, b = line.split()
        out[name] = (int(a), int(b))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--edges", action="store_true", help="print each crossing of the message")
    args = ap.parse_args()
    root: Path = args.tree
    mods = modules(root)
    known = set(mods)
    graph = {m: imports(p, known) - {m} for m, p in mods.items()}
    up: list[tuple[str, str]] = []
    for m, deps in graph.items():
        for d in deps:
            if d != "__init__" and layer(d) > layer(m) and not m.startswith(d + "."):
                up.append((m, d))
    sizes = sorted(((len(p.read_text().splitlines()), m) for m, p in mods.items()), reverse=True)
    print(f"tree: {root}")
    print(f"modules: {len(mods)}, lines: {sum(n for n, _ in sizes)}")
    print(f"arrows up: {len(up)}")
    for m, d in sorted(up):
        print(f"  {m} (layer {layer(m)}) -> {d} (layer {layer(d)})")
    found = circles(graph)
    print(f"circles: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    print("largest: " + ", ".join(f"{m} {n}" for n, m in sizes[:5]))
    if not args.no_trace:
        traced = trace_path(root, verbose=args.edges)
        edges, calls = traced["warm"]
        print(f"a warm message: {edges} module-to-module edges, {calls} calls across modules")
        edges, calls = traced["first"]
        print(f"the first message of a run --once: {edges} edges, {calls} calls across modules")


if __name__ == "__main__":
    main()
