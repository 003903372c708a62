"""The kinds of context requirement by ``type``: one registry, the built-ins registered
through it, plugins through the entry point group ``contemplation.prompt.context``.

A kind says which section of the system prompt its text lands in (``background``, ``state``,
``constraints``, ``notes``) and what one requirement of it becomes: the tool jobs to run
(a title, a NEED tool's name and its arguments; the tool "" gives the ``text`` argument
verbatim, the tool "need" routes a NEED through the rule table), or one phrase saying why
it cannot be used ("has no 'query'"). A plugin's kind usually names a NEED tool that the
same plugin registers (``contemplation.needs.tools``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from contemplation.base import plugins
from contemplation.base.contained import described

Job = tuple[str, str, dict[str, Any]]  # title, tool, arguments
Jobs = Callable[[Mapping[str, Any]], list[Job] | str]

LABELS = {
    "background": "Background",
    "state": "Current state",
    "constraints": "Constraints",
    "notes": "Related notes",
}
MAX_FILES = 10  # files one "files" requirement reads


@dataclass(frozen=True, slots=True)
class ContextKind:
    name: str  # the requirement's "type"
    label: str  # the section its text lands in (a key of LABELS)
    jobs: Jobs  # a requirement -> its tool jobs, or why it cannot be used
    description: str = ""


def _adopt(kind: ContextKind, origin: str) -> ContextKind:
    if kind.label not in LABELS:
        raise ValueError(f"{kind.name}: label {kind.label!r} is not one of {', '.join(LABELS)}")
    if origin == plugins.BUILT_IN:
        return kind
    plugin, jobs = f"{kind.name} ({origin})", kind.jobs

    def contained(requirement: Mapping[str, Any]) -> list[Job] | str:
        """What a plugin's ``jobs`` raises (sys.exit too) makes the requirement unusable."""
        try:
            return jobs(requirement)
        except BaseException as exc:
            failed = f"the context kind of plugin {plugin} failed: {described(exc)}"
            return f"cannot be gathered: {failed}"

    return replace(kind, jobs=contained)


KINDS: plugins.Registry[ContextKind] = plugins.Registry(
    "contemplation.context", ContextKind, lambda: _builtins(), _adopt  # noqa: PLW0108 - below
)
register, kinds, origins, failures = KINDS.register, KINDS.kinds, KINDS.origins, KINDS.failures


def text(req: Mapping[str, Any], *keys: str) -> str:
    """The first of ``keys`` the requirement has, as stripped text ("" when none)."""
    return next((str(req[k]).strip() for k in keys if req.get(k)), "")


def _code_structure(req: Mapping[str, Any]) -> list[Job] | str:
    path = str(req.get("path") or ".")
    return [(f"code structure: {path}", "files.tree", {"path": path})]


def _files(req: Mapping[str, Any]) -> list[Job] | str:
    paths = req.get("paths") or ([req["path"]] if req.get("path") else [])
    if not isinstance(paths, list) or not paths:
        return "has no 'paths' list"
    return [(f"file: {p}", "files.read", {"path": str(p)}) for p in paths[:MAX_FILES]]


def _search(kind: str) -> Jobs:
    def jobs(req: Mapping[str, Any]) -> list[Job] | str:
        query = text(req, "query")
        return (
            [(f"{kind}: {query}", f"{kind}.search", {"query": query})]
            if query
            else ("has no 'query'")
        )

    return jobs


def _state(req: Mapping[str, Any]) -> list[Job] | str:
    thing = text(req, "thing", "query")
    return [(f"state of {thing}", "state.get", {"thing": thing})] if thing else "has no 'thing'"


def _constraints(req: Mapping[str, Any]) -> list[Job] | str:
    items = req.get("items")
    said = "\n".join(f"- {i}" for i in items) if isinstance(items, list) else ""
    said = said or text(req, "text")
    return [("constraints", "", {"text": said})] if said else "is empty"


def _need(req: Mapping[str, Any]) -> list[Job] | str:
    need = text(req, "need")
    return [(need, "need", {"need": need})] if need else "has no 'need'"


def _builtins() -> tuple[ContextKind, ...]:
    return (
        ContextKind("code_structure", "background", _code_structure, "folder layout + names"),
        ContextKind("files", "background", _files, "file contents"),
        ContextKind("notes", "notes", _search("notes"), "notes vault search"),
        ContextKind("memory", "background", _search("memory"), "memory store search"),
        ContextKind("state", "state", _state, "recorded current state"),
        ContextKind("constraints", "constraints", _constraints, "given verbatim"),
        ContextKind("need", "background", _need, "anything a routing rule answers"),
    )
