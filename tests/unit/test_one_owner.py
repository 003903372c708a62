"""One owner per fact: a name of the folder contract, a line of the log format, a
backend kind and its servers' variables are each spelled in one module; the others import it.
These tests read the source (AST), so a copy that creeps back fails here, not in a rename."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from contemplation.protocol import logformat
from contemplation.store import layout
from tests.unit import sources

PKG = Path(layout.__file__).parents[1]  # the package: layout sits in store/

# every file and folder name of the folder contract, as the layout module owns them
LAYOUT_NAMES = {
    layout.ACTIVE, layout.COMPLETED, layout.TEMPLATES, layout.LOG_NAME, layout.METADATA_NAME,
    layout.STATE_NAME, layout.INBOX, layout.CONTEXT, layout.PROCESSING, layout.FAILED,
    layout.ATTACHMENTS, layout.LOCK_NAME, layout.CANCEL_NAME, layout.DAEMON_LOCK,
    layout.DAEMON_INFO,
}  # fmt: skip


@cache  # several tests read every module's strings: found once per run, never changed
def _strings(path: Path, *, skip_targets: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """The string constants of a module (with their lines), f-strings' literal parts too,
    but for the values assigned to the names in ``skip_targets``."""
    skipped: set[int] = set()
    for node in sources.nodes(path):
        if isinstance(node, ast.Assign):
            names = {
                n.id
                for t in node.targets
                for n in ast.walk(t)
                if isinstance(n, ast.Name) and n.id in skip_targets
            }
            if names:
                skipped.update(id(n) for n in ast.walk(node.value))
        elif isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr):  # a docstring: prose, not a path
                skipped.add(id(body[0].value))
    return [
        (node.lineno, node.value)
        for node in sources.nodes(path)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and id(node) not in skipped
    ]  # fmt: skip


def _spelled(strings: list[tuple[int, str]], names: set[str]) -> list[tuple[int, str]]:
    """Constants that name one of ``names``: whole, or as a path's part (``"a/inbox"``)."""
    return [(line, s) for line, s in strings if s in names or set(s.split("/")) & names]


def test_the_layout_names_are_spelled_once() -> None:
    assert len(LAYOUT_NAMES) == 15  # no two facts share a spelling


def test_the_watcher_and_dispatcher_spell_no_folder_or_file_name() -> None:
    """The watcher and the dispatcher name the folder contract's files and folders only
    through :mod:`contemplation.store.layout` (the watcher's roles of a watch are their own
    fact)."""
    for module, skip in (
        ("daemon/watcher.py", frozenset({"ROLE_ACTIVE", "ROLE_CONV", "ROLE_INBOX"})),
        ("daemon/dispatcher.py", frozenset[str]()),
    ):
        found = _spelled(_strings(PKG / module, skip_targets=skip), LAYOUT_NAMES)
        assert found == [], f"{module} spells layout names: {found}"


def test_the_attachments_folder_is_named_by_the_layout_alone() -> None:
    owners = [
        str(p.relative_to(PKG))
        for p in sorted(PKG.rglob("*.py"))
        if _spelled(_strings(p), {layout.ATTACHMENTS})
    ]
    assert owners == ["store/layout.py"]


def test_the_tool_call_line_is_built_and_read_by_the_log_format_alone() -> None:
    """The recorded tool-call line: spelled once, in
    :mod:`contemplation.protocol.logformat`,
    and what it builds it reads back."""
    owners = [
        str(p.relative_to(PKG))
        for p in sorted(PKG.rglob("*.py"))
        if any("(tool call" in s or r"\(tool call" in s for _, s in _strings(p))
    ]
    assert owners == ["protocol/logformat.py"]
    text = "prose\n" + logformat.tool_call_lines("c1", "read", '{"a": 1}', "read x") + "more"
    assert logformat.TOOL_CALL_RE.findall(text) == [("c1", "read", '{"a": 1}', "read x")]


def test_each_backend_kind_declares_its_name_and_server_variables_once() -> None:
    """BUILT_IN, the providers' SECTIONS and SERVER_ENV are derived from
    :mod:`contemplation.base.backend_kinds` (the settings' sections are checked against it); each
    kind's module names itself from it, and the modules that held copies spell none again
    (a hint's prose may name a variable)."""
    import importlib

    from contemplation import backends, settings
    from contemplation.backends import providers
    from contemplation.base import backend_kinds

    assert backends.BUILT_IN == providers.SECTIONS == backend_kinds.NAMES
    for name in backend_kinds.NAMES:
        assert importlib.import_module(f"contemplation.backends.{name}").KIND.name == name
        assert name in settings.Settings.model_fields  # its [section]
    variables = {v for env in backend_kinds.SERVER_ENV_BY_KIND.values() for v in env}
    assert set(settings.SERVER_ENV) == variables
    for module in ("settings.py", "backends/providers.py", "backends/__init__.py"):
        found = [(n, s) for n, s in _strings(PKG / module) if s in variables]
        assert found == [], f"{module} spells a server's variable: {found}"
    for module in ("backends/providers.py", "backends/__init__.py"):
        found = [(n, s) for n, s in _strings(PKG / module) if s in backend_kinds.NAMES]
        assert found == [], f"{module} spells a built-in kind's name: {found}"


def test_queued_messages_are_counted_by_one_reader(tmp_path: Path) -> None:
    """What is queued (inbox/ and processing/) is read by :func:`layout.queued_messages`
    alone: no other module lists both folders to count it again."""
    conv = layout.Conv(tmp_path / "c1")
    for folder, name in ((conv.inbox, "b.txt"), (conv.processing, "0001-a.txt")):
        folder.mkdir(parents=True)
        (folder / name).write_text("hi")
    (conv.inbox / ".hidden.tmp").write_text("being written")
    assert layout.queued_messages(conv) == [conv.inbox / "b.txt", conv.processing / "0001-a.txt"]
    both = [
        str(p.relative_to(PKG))
        for p in sorted(PKG.rglob("*.py"))
        if {"inbox_entries", "processing_entries"}
        <= {n.id for n in sources.nodes(p) if isinstance(n, ast.Name)}
    ]
    assert both == ["store/layout.py"]


def _spelling(fact: str) -> list[str]:
    """Where the package's code (docstrings left out) spells ``fact`` in a string."""
    return [
        f"{path.relative_to(PKG)}:{line}"
        for path in sorted(PKG.rglob("*.py"))
        if path.name != "logformat.py"
        for line, s in _strings(path)
        if fact in s
    ]


def test_the_header_timestamp_is_spelled_by_the_log_format_alone() -> None:
    """Four modules spelled the headers' time format; the log format owns it."""
    assert _spelling(logformat.TIME_FORMAT) == []


def test_the_need_prefix_is_spelled_by_the_log_format_alone() -> None:
    """``NEED:`` was spelled at five sites beside ``logformat.NEED_PREFIX``."""
    assert _spelling(logformat.NEED_PREFIX) == []


def test_the_inbox_is_filtered_by_the_layout_alone(tmp_path: Path) -> None:
    """The dispatcher's own filter took any name not starting with a dot for a
    message (an editor's ``draft.txt~`` or a ``part.tmp`` being written woke a look); the
    layout's ``ignored_name`` is the one filter of the inbox."""
    from contemplation.daemon.dispatcher import signs_of_work

    active = tmp_path / layout.ACTIVE
    conv = active / "c1"
    (conv / layout.INBOX).mkdir(parents=True)
    (conv / layout.PROCESSING).mkdir()
    (conv / layout.LOG_NAME).write_text("")
    for name in ("draft.txt~", "part.tmp", "#note#", ".hidden"):
        (conv / layout.INBOX / name).write_text("being written")
        assert layout.ignored_name(name)
    assert signs_of_work(str(active), {"c1": 0}, set()) == []
    (conv / layout.INBOX / "message.txt").write_text("hello")
    assert signs_of_work(str(active), {"c1": 0}, set()) == ["c1"]
