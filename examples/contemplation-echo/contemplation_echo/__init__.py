"""An example plugin: ``NEED: Upper case of hello`` is answered with ``HELLO`` (this module),
a context requirement ``{"type": "upper", "text": "hello"}`` puts ``HELLO`` into a new
conversation's system prompt, and the ``echo`` backend (:mod:`contemplation_echo.backend`).

A NEED tool is a :class:`~contemplation.needs.tools.registry.ToolKind`: its name (what a rule's
``tool`` says), a one-line description, the argument a rule's capture fills, how the tool is
made from the settings, and the NEED rules it offers (checked after the config's own). The
tool itself has a ``name`` and an async ``call(arguments)`` that returns a ``ToolResult``; a
``ready`` attribute, when it has one, says whether the model is told about it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contemplation.plugin import (
    ContextKind,
    Job,
    Rule,
    ToolError,
    ToolInputs,
    ToolKind,
    ToolResult,
    text,
)

MAX_CHARS = 10_000  # an answer stays small whatever the model asks


class Upper:
    name = "upper"

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        text = arguments.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ToolError("missing argument 'text'")
        return ToolResult(text.strip()[:MAX_CHARS].upper(), "upper")


def _make(made: ToolInputs) -> Upper:  # made.settings, made.pool and the tools made before it
    return Upper()


upper = ToolKind(
    "upper",
    "the text it is given, in capitals",
    default_arg="text",
    make=_make,
    rules=(
        Rule(
            "upper_case",
            "upper",
            {"text": "{text}"},
            prefix="Upper case of",
            param="text",
            description="The given text in capitals.",
        ),
    ),
)


def _upper_jobs(requirement: Mapping[str, Any]) -> list[Job] | str:
    """A requirement -> the tool jobs that gather it, or why it cannot be used."""
    said = text(requirement, "text")
    return [(f"upper: {said}", "upper", {"text": said})] if said else "has no 'text'"


# a context requirement kind: its "type", the prompt section it lands in, its jobs
upper_context = ContextKind("upper", "background", _upper_jobs, "the text in capitals")
