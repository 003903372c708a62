"""The move into rooms by layer, as one scripted, reviewable step: ``git mv`` of every
module into the folder of its layer, then every import, module string and path in the code,
the tests, the benchmarks, the scripts and the docs rewritten to match.

    python scripts/rooms.py [--tree DIR]      (run once, on a clean tree; then ruff's import sort)

A module the table does not place stops the script before anything moves: every module gets
a room on purpose. The script is kept in the repository as the record of the move: what went
where is the table below, and ``git log --follow`` finds a file's history across it.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import textwrap
import tokenize
from pathlib import Path

# old module (under contemplation.) -> new module. Modules not named stay where they are.
STAY = {"__init__", "__main__", "errors", "models", "settings", "plugin", "writer", "backends",
        "needs"}  # fmt: skip
MOVES: dict[str, str] = {
    # base/: what every layer may use, knowing nothing of conversations
    "aio": "base.aio",
    "contained": "base.contained",
    "exits": "base.exits",
    "logs": "base.logs",
    "plugins": "base.plugins",
    "privacy": "base.privacy",
    "redact": "base.redact",
    "secret_names": "base.secret_names",
    "backend_kinds": "base.backend_kinds",
    "sdnotify": "base.sdnotify",
    "terminal": "base.terminal",
    "testing": "base.testing",
    # protocol/: pure, the log's grammar and what it means
    "logformat": "protocol.logformat",
    "parser": "protocol.parser",
    "conversation": "protocol.conversation",
    "structured": "protocol.structured",
    "schema_rules": "protocol.schema_rules",
    "replycheck": "protocol.replycheck",
    "paging": "protocol.paging",
    # store/: the home, read side
    "layout": "store.layout",
    "logview": "store.logview",
    "logstream": "store.logstream",
    "cursors": "store.cursors",
    "openfiles": "store.openfiles",
    "templates": "store.templates",
    "attachments": "store.attachments",
    "activity": "store.activity",
    "waiting": "store.waiting",
    # backends/: with the providers that name them
    "providers": "backends.providers",
    # index/: the sqlite index and what reads it
    "index_db": "index.db",
    "index_rows": "index.rows",
    "search_index": "index.search",
    "search_query": "index.query",
    "snippets": "index.snippets",
    "listing": "index.listing",
    "retention": "index.retention",
    # needs/: answering a NEED line, the tools that answer it included
    "tools": "needs.tools",
    # prompt/: what is sent to the model
    "context": "prompt.context",
    "context_kinds": "prompt.context_kinds",
    "summarise": "prompt.summarise",
    "prompts": "prompt.prompts",
    "budget": "prompt.budget",
    "reach": "prompt.reach",
    # config/: the whole configuration, checked as one and reloaded without a restart
    "validate": "config.validate",
    "reload": "config.reload",
    # engine/: a turn from a message to its reply
    "steps": "engine.steps",
    "breaker": "engine.breaker",
    "probing": "engine.probing",
    "retryclock": "engine.retryclock",
    "runtime": "engine.runtime",
    "tracking": "engine.tracking",
    "scheduler": "engine.scheduler",
    "turn": "engine.turn",
    "retrying": "engine.retrying",
    "answering": "engine.answering",
    "pipeline": "engine.pipeline",
    "inflight": "engine.inflight",
    # daemon/: the composition root and what only the running daemon does
    "daemon": "daemon.root",
    "dispatcher": "daemon.dispatcher",
    "watcher": "daemon.watcher",
    "index_keeper": "daemon.index_keeper",
    "notify": "daemon.notify",
    "loopwatch": "daemon.loopwatch",
    "limits": "daemon.limits",
    # faces/: what people and agents touch
    "reading": "faces.reading",
    "actions": "faces.actions",
    "fork": "faces.fork",
    "bearer": "faces.bearer",
    "service": "faces.service",
    "service_env": "faces.service_env",
    "service_status": "faces.service_status",
    "cli": "faces.cli.root",
    "cli_common": "faces.cli.common",
    "cli_conv": "faces.cli.conv",
    "cli_daemon": "faces.cli.daemon",
    "cli_fork": "faces.cli.fork",
    "cli_recover": "faces.cli.recover",
    "cli_index": "faces.cli.index",
    "cli_models": "faces.cli.models",
    "cli_plugins": "faces.cli.plugins",
    "cli_routes": "faces.cli.routes",
    "cli_service": "faces.cli.service",
    "cli_store": "faces.cli.store",
    "cli_wait": "faces.cli.wait",
    "show": "faces.cli.show",
    "plugin_probe": "faces.cli.probe",
    "mcp_server": "faces.mcp.server",
    "mcp_faces": "faces.mcp.calls",
    "mcp_arguments": "faces.mcp.arguments",
    "mcp_subscriptions": "faces.mcp.subscriptions",
    "mcp_tasks": "faces.mcp.tasks",
    "dashboard": "faces.dashboard",
}
ROOMS: dict[str, str] = {
    "base": "What every layer may use and that knows nothing of conversations: asyncio helpers, "
    "exit codes, logging, plugin loading, private files, redaction, the clock for retries.",
    "protocol": "Pure: the log's grammar (framing, parsing), what a conversation needs next, "
    "structured answers and their schemas, pages. No file is read or written here.",
    "store": "The home, read side: its layout, the log as segments and cursors, templates, "
    "attachments, and what a conversation is doing or waiting for.",
    "index": "The sqlite index of every log: rows, search, lists, retention.",
    "prompt": "What is sent to the model: context, the system prompt, the history's budget, "
    "summaries.",
    "config": "The whole configuration: one check of it (run, doctor, templates, service reload) "
    "and its reload without a restart.",
    "engine": "A turn, from a message to its reply: the pipeline, turns, retries, need answers, "
    "the runtime's slots and breakers, the background probes of a resting provider.",
    "daemon": "The running daemon: the composition root, the watcher, the dispatcher, "
    "notifications, the index keeper.",
    "faces": "What people and agents touch: the CLI, the MCP server, the dashboard, and what "
    "they share (reading, actions, fork, the bearer token, the service).",
    "faces.cli": "The click CLI: one module a command group; ``root`` is the entry point.",
    "faces.mcp": "The MCP server: the SDK wiring, the tools' bodies, arguments, subscriptions.",
}
# literals that look like module paths but are names the outside world knows
KEEP_LITERALS = {
    '"contemplation.context"',
    '"contemplation.panels"',
    '"contemplation.service"',
    '"contemplation.tools"',
    '"contemplation.backends"',
}
KEEP = re.compile("|".join(re.escape(k) for k in sorted(KEEP_LITERALS)))
# what a rewrite of names cannot do: exact edits after the move (file, old, new)
POST_EDITS: list[tuple[str, str, str]] = [
    # the lazy command table names its modules within the CLI's room (lines stay short)
    ("contemplation/faces/cli/root.py", '"contemplation.faces.cli.', '"'),
    (
        "contemplation/faces/cli/root.py",
        "importlib.import_module(module)",
        'importlib.import_module(f"contemplation.faces.cli.{module}")',
    ),
    # resources through importlib.resources, never built from __file__ (a move broke one)
    (
        "contemplation/store/templates.py",
        "from pathlib import Path\n",
        "from importlib import resources\nfrom pathlib import Path\n",
    ),
    (
        "contemplation/store/templates.py",
        'return Path(__file__).parent / "skeleton" / "templates"',
        'return Path(str(resources.files("contemplation").joinpath("skeleton", "templates")))',
    ),
    (
        "contemplation/faces/service.py",
        "from pathlib import Path\n",
        "from importlib import resources\nfrom pathlib import Path\n",
    ),
    (
        "contemplation/faces/service.py",
        'TEMPLATES = Path(__file__).parent / "service_templates"  # a link to service/ in the repo',
        "# a link to service/ in the repo\n"
        'TEMPLATES = Path(str(resources.files("contemplation").joinpath("service_templates")))',
    ),
    (
        "contemplation/faces/dashboard/app.py",
        "from pathlib import Path\n",
        "from importlib import resources\nfrom pathlib import Path\n",
    ),
    (
        "contemplation/faces/dashboard/app.py",
        'STATIC = Path(__file__).parent / "static"',
        'STATIC = Path(str(resources.files("contemplation.faces.dashboard").joinpath("static")))',
    ),
    # the child's path: the folder that holds the package, however deep this module sits
    (
        "contemplation/protocol/replycheck.py",
        "here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))",
        'here = str(Path(__file__).resolve().parents[__name__.count(".")])',
    ),
    (
        "contemplation/protocol/replycheck.py",
        "from collections.abc import Mapping\n",
        "from collections.abc import Mapping\nfrom pathlib import Path\n",
    ),
    (
        "pyproject.toml",
        "contemplation/{listing,search_index,index_db}.py",
        "contemplation/index/{listing,search,db}.py",
    ),
]
CODE_DIRS = ("contemplation", "tests", "bench", "scripts", "examples")
TEXT_SUFFIXES = {".md", ".toml", ".sh", ".txt", ".cfg", ".ini", ".yml", ".yaml"}
SKIP_PARTS = {".venv", ".peers", "node_modules", "build", "__pycache__", ".git"}


def new_of(dotted: str) -> str | None:
    """``dotted`` (under contemplation., maybe with attributes after the module) moved, or
    None when it did not move."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in MOVES:
            return ".".join([MOVES[head], *parts[n:]])
    return None


DOTTED = re.compile(r"(?<![\w.])contemplation\.([a-z_][a-z0-9_]*(?:\.[a-zA-Z_][a-zA-Z0-9_]*)*)")
SLASHED = re.compile(r"(?<![\w/.])contemplation/([a-z_][a-z0-9_]*(?:/[a-z_][a-z0-9_]*)*)(\.py)?")
FROM_PKG = re.compile(
    r"^(?P<indent>[ \t]*)from contemplation import "
    r"(?P<names>\([^)]*\)|[^\n]*?)(?P<tail>[ \t]*#[^\n]*)?$",
    re.M,
)
LOGGER = re.compile(r"get_logger\(\s*\"contemplation\.[a-z_.]+\"\s*\)")


# bare, and not where a module is named: the unit's and the entry points' names
BARE_KEEP = {"service", "context", "panels", "tools"}


def rewrite_dotted(text: str, *, prose: bool = False) -> str:
    keep: dict[str, str] = {}

    def hide(m: re.Match[str]) -> str:
        key = f"\x00{len(keep)}\x00"
        keep[key] = m.group(0)
        return key

    text = KEEP.sub(hide, text)
    text = LOGGER.sub(hide, text)

    def sub(m: re.Match[str]) -> str:
        before = text[max(0, m.start() - 7) : m.start()]
        as_module = before.endswith(("from ", "import ", "`"))
        if m.group(1) in BARE_KEEP and (prose or not as_module):
            return m.group(0)
        moved = new_of(m.group(1))
        return m.group(0) if moved is None else f"contemplation.{moved}"

    text = DOTTED.sub(sub, text)
    for key, value in keep.items():
        text = text.replace(key, value)
    return text


def rewrite_slashed(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        moved = new_of(m.group(1).replace("/", "."))
        if moved is None:
            return m.group(0)
        return "contemplation/" + moved.replace(".", "/") + (m.group(2) or "")

    return SLASHED.sub(sub, text)


def rewrite_from_package(text: str) -> str:
    """``from contemplation import a, b as c`` with moved modules: one line per moved module,
    bound to the same name, the rest left on the original line."""

    def sub(m: re.Match[str]) -> str:
        indent = m.group("indent")
        raw = m.group("names").strip().strip("()")
        names = [n.strip() for n in re.split(r",", re.sub(r"#[^\n]*", "", raw)) if n.strip()]
        stay: list[str] = []
        out: list[str] = []
        for n in names:
            name, _, alias = (p.strip() for p in n.partition(" as "))
            bound = alias or name
            moved = MOVES.get(name)
            if moved is None:
                stay.append(n)
                continue
            parent, _, leaf = moved.rpartition(".")
            as_ = f" as {bound}" if leaf != bound else ""
            out.append(f"{indent}from contemplation.{parent} import {leaf}{as_}")
        if not out:
            return m.group(0)
        if stay:
            out.insert(0, f"{indent}from contemplation import {', '.join(stay)}")
        tail = m.group("tail") or ""
        if "noqa" in tail:  # each line keeps what it was excused from
            return "\n".join(line + tail for line in out)
        return "\n".join(out) + tail

    return FROM_PKG.sub(sub, text)


WIDTH = 100


def wrap_long(text: str) -> str:
    """Lines the longer names pushed past the width, inside docstrings and comments only,
    wrapped at a space with the line's own indent (code lines are left to the formatter)."""
    prose: set[int] = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip():
                prose.add(tok.start[0])  # a whole-line comment, never one after code
            elif tok.type == tokenize.STRING and (
                tok.start[0] != tok.end[0] or tok.line.strip().startswith('"""')
            ):
                prose.update(range(tok.start[0], tok.end[0] + 1))
    except (tokenize.TokenError, SyntaxError):
        return text
    out: list[str] = []
    for n, whole in enumerate(text.split("\n"), 1):
        line = whole
        moved = any(w in line for w in ("contemplation.", "contemplation/", "tests"))  # rewritten
        while n in prose and moved and len(line) > WIDTH:
            indent = line[: len(line) - len(line.lstrip())]
            comment = line.lstrip().startswith("#")
            cut = line.rfind(" ", len(indent) + 1, WIDTH + 1)
            if cut <= len(indent) + 2:
                break
            out.append(line[:cut].rstrip())
            line = indent + ("# " if comment else "") + line[cut + 1 :]
        out.append(line)
    return "\n".join(out)


# a test file that starts processes, servers, browsers or peers is a system test; the rest
# run in-process and go to the room their imports are mostly from
SYSTEM = re.compile(
    r"subprocess|Popen|daemon_factory|\bcli\(|chromium|playwright|llama_server|realpeers|"
    r"from tests\.peers|serve\(|mcp_http|claude|start_daemon|xllamacpp"
)
TOP_ROOMS = {"errors": "protocol", "models": "protocol", "settings": "store", "plugin": "faces"}


def test_moves(root: Path) -> dict[str, str]:
    """tests/test_x.py -> tests/system/test_x.py or tests/unit/<room>/test_x.py (paths from
    the root), decided on the files as they are after the package moved."""
    out: dict[str, str] = {}
    for f in sorted((root / "tests").glob("test_*.py")):
        text = f.read_text()
        if SYSTEM.search(text):
            out[f"tests/{f.name}"] = f"tests/system/{f.name}"
            continue
        rooms = [
            m.split(".")[0] for m in re.findall(r"from contemplation\.([a-z_.]+) import", text)
        ]
        rooms += [m for m in re.findall(r"from contemplation import ([a-z_]+)", text)]
        rooms = [TOP_ROOMS.get(r, r) for r in rooms]
        room = max(sorted(set(rooms)), key=rooms.count) if rooms else "protocol"
        out[f"tests/{f.name}"] = f"tests/unit/{room}/{f.name}"
    return out


def rewrite_tests(text: str, moves: dict[str, str]) -> str:
    """Test paths (``tests/test_x.py``, node ids too) and modules (``tests.test_x``)."""

    def path(m: re.Match[str]) -> str:
        return moves.get(m.group(0), m.group(0))

    def module(m: re.Match[str]) -> str:
        moved = moves.get(f"tests/{m.group(1)}.py")
        return m.group(0) if moved is None else moved.removesuffix(".py").replace("/", ".")

    text = re.sub(r"(?<![\w/])tests/test_[a-z0-9_]+\.py", path, text)
    return re.sub(r"(?<![\w.])tests\.(test_[a-z0-9_]+)\b", module, text)


def deepen(text: str, depth: int) -> str:
    """A moved test's way up to the repository root."""
    for old, new in (
        ("Path(__file__).resolve().parent.parent", f"Path(__file__).resolve().parents[{depth}]"),
        ("Path(__file__).parent.parent", f"Path(__file__).parents[{depth}]"),
    ):
        text = text.replace(old, new)
    return text


def files(root: Path) -> list[Path]:
    out = []
    for p in root.rglob("*"):
        if not p.is_file() or SKIP_PARTS & set(p.relative_to(root).parts):
            continue
        code = p.suffix == ".py" and p.relative_to(root).parts[0] in CODE_DIRS
        if code or p.suffix in TEXT_SUFFIXES or p.name == "run":
            out.append(p)
    return out


def modules(root: Path) -> set[str]:
    pkg = root / "contemplation"
    return {
        p.stem if p.is_file() else p.name
        for p in pkg.iterdir()
        if (p.suffix == ".py") or (p.is_dir() and (p / "__init__.py").exists())
    }


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True)


def move_tests(root: Path) -> dict[str, str]:
    tests = test_moves(root)
    for old, new in tests.items():
        dst = root / new
        for d in (dst.parent, dst.parent.parent):
            if d != root / "tests" and not (d / "__init__.py").exists():
                d.mkdir(parents=True, exist_ok=True)
                (d / "__init__.py").write_text("")
                git(root, "add", str(d / "__init__.py"))
        git(root, "mv", old, new)
        dst.write_text(deepen(dst.read_text(), len(Path(new).parts) - 1))
    return tests


def move(root: Path) -> None:
    unplaced = modules(root) - STAY - set(MOVES)
    if unplaced:
        raise SystemExit(f"no room for: {', '.join(sorted(unplaced))} (add them to MOVES)")
    pkg = root / "contemplation"
    for room, doc in ROOMS.items():
        d = pkg.joinpath(*room.split("."))
        d.mkdir(parents=True, exist_ok=True)
        init = d / "__init__.py"
        if not init.exists():
            init.write_text('"""' + textwrap.fill(doc, WIDTH - 4) + '"""\n')
            git(root, "add", str(init))
    for old, new in MOVES.items():
        src = pkg / f"{old}.py" if (pkg / f"{old}.py").exists() else pkg / old
        dst = (
            pkg.joinpath(*new.split("."))
            if src.is_dir()
            else pkg.joinpath(*new.split(".")).with_suffix(".py")
        )
        git(root, "mv", str(src.relative_to(root)), str(dst.relative_to(root)))
    for f in files(root):
        text = f.read_text()
        # dotted first: after it, a module path may begin with a room named as an old module
        # (daemon), and must not be moved twice
        new = rewrite_slashed(rewrite_from_package(rewrite_dotted(text, prose=f.suffix != ".py")))
        if f.suffix == ".py":
            new = wrap_long(new)
        if new != text:
            f.write_text(new)
    tests = move_tests(root)  # by what they import, once the imports name the rooms
    for f in files(root):
        text = f.read_text()
        new = rewrite_tests(text, tests)
        if f.suffix == ".py":
            new = wrap_long(new)
        if new != text:
            f.write_text(new)
    for rel, old, new in POST_EDITS:
        f = root / rel
        text = f.read_text()
        if old not in text:
            raise SystemExit(f"{rel}: {old!r} not found")
        f.write_text(text.replace(old, new))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args()
    move(args.tree)
    print("moved; now: ruff check --select I --fix contemplation tests bench scripts examples")


if __name__ == "__main__":
    main()
