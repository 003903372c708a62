"""The NEED tools by name: one registry, the built-ins registered through it.

A tool kind says, in one place, everything the rest of the daemon needs of it: its name
(``family.verb``), the one-line description the rule table and ``routes`` show, the argument a
rule's capture fills (``path``, ``query``; None for a kind that takes none), and how it is
made from the settings. The rule compiler (``needs/rules.py``) reads names, descriptions and
default arguments from here; the router makes the tools from here; whether a made tool is set
up in this configuration (a vault, allowed folders, a search server) is the tool's own
``ready`` (a tool without one is always ready).

Adding a built-in tool is one module plus its :func:`register` call in :func:`_builtins`.
A plugin adds one through the same call: a distribution that declares an entry point in the
group ``contemplation.needs.tools`` naming a :class:`ToolKind` (or a callable that returns one or
several) is loaded when the registry is first read. A plugin that fails to import or to
register costs one log line and a row in ``doctor`` and ``plugins``, never the daemon; a
plugin's tool is made and called under a guard (:class:`_Contained`): whatever its ``make``
or its ``call`` raises, ``BaseException`` included, is the need's failure naming the plugin.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from contemplation.base import plugins
from contemplation.base.contained import described, ours
from contemplation.errors import ToolError
from contemplation.models import Rule

if TYPE_CHECKING:  # making a tool imports its module: naming one does not
    from contemplation.needs.tools.base import Tool, ToolResult
    from contemplation.needs.tools.mcp import McpPool
    from contemplation.needs.tools.memory import JsonStore
    from contemplation.settings import Settings


@dataclass(frozen=True, slots=True)
class ToolInputs:
    """What a tool is made from: the settings, the MCP servers, the tools made before it."""

    settings: Settings
    pool: McpPool
    tools: dict[str, Tool]


@dataclass(frozen=True, slots=True)
class ToolKind:
    name: str
    description: str
    default_arg: str | None = "query"  # None: the tool takes no argument from the need
    make: Callable[[ToolInputs], Tool] | None = None  # None: nothing to make ("agent")
    rules: tuple[Rule, ...] = ()  # the NEED rules it offers (after the config's own)


class _Contained:
    """A plugin's tool (or, ``inner`` None, the one it failed to make): what its ``call``
    raises, ``BaseException`` included, is a :class:`ToolError` naming the plugin (the need's
    failure); a cancel of the daemon's own (a timeout, a stop) goes on."""

    def __init__(self, name: str, plugin: str, inner: Tool | None, why: str = "") -> None:
        self.name, self.plugin, self._inner, self._why = name, plugin, inner, why

    @property
    def ready(self) -> bool:
        return self._inner is not None and ready(self._inner)

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        if self._inner is None:
            raise ToolError(f"the plugin {self.plugin} could not make its tool: {self._why}")
        try:
            return await self._inner.call(arguments)
        except ToolError:
            raise
        except BaseException as exc:
            if ours(exc):
                raise
            raise ToolError(f"the tool of plugin {self.plugin} failed: {described(exc)}") from exc


def _adopt(kind: ToolKind, origin: str) -> ToolKind:
    if origin == plugins.BUILT_IN:
        return kind
    plugin = f"{kind.name} ({origin})"
    make = kind.make

    def contained(m: ToolInputs) -> Tool:
        assert make is not None
        try:
            return _Contained(kind.name, plugin, make(m))
        except BaseException as exc:  # sys.exit too: this tool fails, the others are made
            return _Contained(kind.name, plugin, None, described(exc))

    # a plugin's rules say where they come from (`routes`, errors)
    return replace(
        kind,
        make=None if make is None else contained,
        rules=tuple(replace(r, source=f"plugin {origin}") for r in kind.rules),
    )


KINDS: plugins.Registry[ToolKind] = plugins.Registry(
    "contemplation.tools", ToolKind, lambda: _builtins(), _adopt  # noqa: PLW0108 - defined below
)
register, kinds, origins, failures = KINDS.register, KINDS.kinds, KINDS.origins, KINDS.failures


def default_arg(name: str) -> str | None:
    kind = kinds().get(name)
    return kind.default_arg if kind is not None else None


def make_all(settings: Settings, pool: McpPool) -> dict[str, Tool]:
    """Every kind that makes a tool, made from ``settings`` in registration order."""
    made: dict[str, Tool] = {}
    for kind in kinds().values():
        if kind.make is not None:
            made[kind.name] = kind.make(ToolInputs(settings, pool, made))
    return made


def ready(tool: object) -> bool:
    """Whether a made tool is set up in this configuration (its own ``ready``; else yes)."""
    return bool(getattr(tool, "ready", True))


def each_ready(tools: Sequence[object]) -> tuple[bool, ...]:
    """:func:`ready` of each of ``tools`` (None: no tool made, which is ready too)."""
    return tuple(ready(t) for t in tools)


def _files_read(m: ToolInputs) -> Tool:
    from contemplation.needs.tools.files import FileReader, config_files

    t = m.settings.tools
    return FileReader(
        t.allowed_roots,
        max_bytes=t.max_file_bytes,
        deny=t.deny,
        answer_chars=t.answer_budget_chars,
        protected=config_files(m.settings),
    )


def _files_tree(m: ToolInputs) -> Tool:
    from contemplation.needs.tools.files import FileReader, FileTree

    reader = m.tools["files.read"]
    assert isinstance(reader, FileReader)  # registered before it, below
    return FileTree(reader)


def _notes(m: ToolInputs) -> Tool:
    from contemplation.needs.tools.notes import NotesSearch

    return NotesSearch(m.settings.tools.notes_vault)


def _store(m: ToolInputs, file: str) -> JsonStore:
    from contemplation.needs.tools.memory import JsonStore
    from contemplation.store.layout import Home

    return JsonStore(Home(m.settings.home), file, durable=m.settings.durability == "fsync")


def _memory(m: ToolInputs) -> Tool:
    from contemplation.needs.tools.memory import MEMORY_FILE, MemorySearch

    return MemorySearch(_store(m, MEMORY_FILE))


def _state(m: ToolInputs) -> Tool:
    from contemplation.needs.tools.memory import STATE_FILE
    from contemplation.needs.tools.state import StateLookup

    return StateLookup(_store(m, STATE_FILE))


def _web(m: ToolInputs) -> Tool:
    from contemplation.needs.tools.search import ConfiguredSearch

    t = m.settings.tools
    return ConfiguredSearch(m.pool, t.search_tool, t.search_arguments)


def _builtins() -> tuple[ToolKind, ...]:
    memory = Rule(
        "brain_memory",
        "memory.search",
        {"query": "{topic}"},
        prefix="Brain memory about",
        param="topic",
        description="What the shared memory holds about a topic.",
    )
    notes = Rule(
        "search_notes",
        "notes.search",
        {"query": "{query}"},
        prefix="Obsidian notes matching",
        param="query",
        description="Notes in the Markdown vault that match a query (titles, paths, snippets).",
    )
    files = Rule(
        "read_file",
        "files.read",
        {"path": "{path}"},
        prefix="File contents of",
        param="path",
        description="The contents of a text file inside the allowed folders.",
    )
    web = Rule(
        "web_search",
        "web.search",
        {"query": "{query}"},
        prefix="Search results for",
        param="query",
        description="Results of a search for a query.",
    )
    state = Rule(
        "current_state",
        "state.get",
        {"thing": "{thing}"},
        prefix="Current state of",
        param="thing",
        description="The recorded current state of a thing (a service, a project, a task).",
    )
    return (
        ToolKind(
            "memory.search",
            "search the durable memory store",
            make=_memory,
            rules=(memory,),
        ),
        ToolKind(
            "notes.search",
            "full-text search of the Markdown notes vault",
            make=_notes,
            rules=(notes,),
        ),
        ToolKind(
            "files.read",
            "read a file inside the allowed folders",
            default_arg="path",
            make=_files_read,
            rules=(files,),
        ),
        ToolKind(
            "files.tree",
            "the layout of a folder inside the allowed folders",
            default_arg="path",
            make=_files_tree,
        ),
        ToolKind(
            "web.search",
            "the configured search tool (tools.search_tool)",
            make=_web,
            rules=(web,),
        ),
        ToolKind(
            "state.get",
            "look up the recorded current state of something",
            default_arg="thing",
            make=_state,
            rules=(state,),
        ),
        ToolKind("agent", "no tool: the agent answers", default_arg=None),
    )


def default_rules() -> tuple[Rule, ...]:
    """The rules the registered tool kinds offer, in registration order (the built-ins'
    first): checked after the template's and the config's."""
    return tuple(r for kind in kinds().values() for r in kind.rules)
