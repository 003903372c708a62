"""Pure: the tool definitions a request offers, in one canonical form.

A server reuses its cache for a byte-identical prefix of the prompt, and the tool definitions
are part of that prefix (a chat template renders them into the system turn). Whatever order
the rules, a config or an MCP server list the tools in, and whatever order the keys of their
schemas were built in, the request carries them the same way: tools sorted by function name,
every object's keys sorted (arrays keep their order: ``required`` and ``enum`` say something
by it). Two daemons, or two turns, with the same tools send the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def canonical(value: Any) -> Any:
    """``value`` with the keys of every mapping in it sorted (lists and tuples keep order)."""
    if isinstance(value, Mapping):
        return {str(k): canonical(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    return value


def _name(spec: Mapping[str, Any]) -> str:
    fn = spec.get("function")
    name = fn.get("name") if isinstance(fn, Mapping) else spec.get("name")
    return str(name or "")


def canonical_tools(specs: Iterable[Mapping[str, Any]]) -> tuple[dict[str, Any], ...]:
    """``specs`` (Ollama/OpenAI ``tools`` entries) sorted by function name, each in
    :func:`canonical` form; two of one name keep a fixed order by their JSON text."""
    tools = [canonical(s) for s in specs]
    return tuple(sorted(tools, key=lambda t: (_name(t), json.dumps(t, sort_keys=True))))
