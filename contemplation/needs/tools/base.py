"""The tool contract: one async call that turns arguments into text, or raises ToolError.

A tool owns its own limits (bytes read, files scanned, results returned) and says where its
answer came from (``source``) and whether it held back more than it returned (``more``).
The answer budget (characters per answer) is applied on top by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from contemplation.errors import ToolError


@dataclass(frozen=True, slots=True)
class ToolResult:
    text: str
    source: str  # what was read or asked: a path, a server and tool, a store
    more: bool = False  # the tool itself left something out (a file cut at its byte cap ...)
    note: str = ""  # one line about how the answer was made (truncation, fallbacks)


class Refused(ToolError):
    """A request the tool will not carry out (a path outside the roots, a denied name)."""


class Unconfigured(ToolError):
    """The tool is not set up (no notes vault, no search server). Its text is what the model
    is told, in words about the source (the model cannot change the configuration); ``hint``
    is the person's: the setting to change (the daemon's log, ``doctor``)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


@runtime_checkable
class Tool(Protocol):
    name: str

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult: ...


def text_arg(arguments: Mapping[str, Any], key: str, *, limit: int = 1000) -> str:
    """A required string argument, trimmed; :class:`ToolError` when it is missing."""
    value = arguments.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ToolError(f"missing argument {key!r}")
    text = value if isinstance(value, str) else str(value)
    return text.strip()[:limit]


def trim(text: str, budget: int) -> tuple[str, int]:
    """``text`` cut to ``budget`` characters at a line end (else a space) when one is near;
    and how many characters were left out."""
    if len(text) <= budget:
        return text, 0
    floor = int(budget * 0.8)
    cut = text.rfind("\n", floor, budget)
    if cut < 0:
        cut = text.rfind(" ", floor, budget)
    kept = text[: cut if cut > 0 else budget].rstrip()
    return kept, len(text) - len(kept)


PLACEHOLDER_RE = re.compile(r"\{\{|\}\}|\{([^{}]*)\}")  # {name} in a tool's arguments


def fill(template: Any, values: Mapping[str, str]) -> Any:
    """Fill ``{name}`` placeholders (``{{``/``}}`` are literal braces) in nested values."""
    if isinstance(template, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "{{":
                return "{"
            if m.group(0) == "}}":
                return "}"
            return values.get(m.group(1) or "", "")

        return PLACEHOLDER_RE.sub(sub, template)
    if isinstance(template, Mapping):
        return {k: fill(v, values) for k, v in template.items()}
    if isinstance(template, list | tuple):
        return [fill(v, values) for v in template]
    return template
