"""The one module a plugin imports: every name a tool, backend, context kind or dashboard card
is written against, and nothing else.

A plugin declares entry points (``contemplation.tools``, ``contemplation.backends``,
``contemplation.context``, ``contemplation.cards``) that name objects built from these
classes; docs/guides/plugins.md walks through one of each. A backend: ``BackendKind``, what its
``make`` receives (``BackendInputs``), the ``Backend`` contract and its request, stream and
usage types. A tool: ``ToolKind``, ``ToolInputs``, ``Tool``, ``ToolResult``, its ``Rule`` and
its refusals (``ToolError``, ``Refused``, ``Unconfigured``). A context kind: ``ContextKind``,
``Job``, ``text``. A dashboard card: ``Card``, ``Row``, ``Seen``.

Deprecated, kept for this major version: ``Panel`` (a ``Card`` by its former name), and the
entry point group `contemplation.panels`, still read; a dashboard card was called a panel
until a panel came to mean several models answering one round.

The promise: a name in ``__all__`` keeps its meaning and its import path for the whole of a
major version; the package's other modules are its own to move (one move took all of them
at once, and no plugin noticed).
"""

from __future__ import annotations

from contemplation.backends import BackendInputs, BackendKind
from contemplation.backends.base import Backend, Capabilities, Check, PhaseTimeouts
from contemplation.errors import BackendError, ToolError
from contemplation.faces.card import Card, Panel, Row, Seen
from contemplation.models import (
    BackendSession,
    ChatMessage,
    ChatRequest,
    ImageRef,
    Rule,
    StreamEvent,
    Usage,
)
from contemplation.needs.tools.base import Refused, Tool, ToolResult, Unconfigured
from contemplation.needs.tools.registry import ToolInputs, ToolKind
from contemplation.prompt.context_kinds import ContextKind, Job, text

__all__ = [
    "Backend",
    "BackendError",
    "BackendInputs",
    "BackendKind",
    "BackendSession",
    "Capabilities",
    "Card",
    "ChatMessage",
    "ChatRequest",
    "Check",
    "ContextKind",
    "ImageRef",
    "Job",
    "Panel",
    "PhaseTimeouts",
    "Refused",
    "Row",
    "Rule",
    "Seen",
    "StreamEvent",
    "Tool",
    "ToolError",
    "ToolInputs",
    "ToolKind",
    "ToolResult",
    "Unconfigured",
    "Usage",
    "text",
]
