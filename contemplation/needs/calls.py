"""Native tool calls as NEED lines: a call the model made through the server's tool API (or
wrote as JSON text) is written into its reply as ``NEED:`` under a ``(tool call …)`` line, so
the ordinary answer cycle answers it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from contemplation.models import Rule
from contemplation.needs import rules
from contemplation.protocol.logformat import NEED_PREFIX, tool_call_lines


def may_hold_calls(text: str) -> bool:
    """Could ``text`` hold tool calls written as JSON (a JSON name, and no NEED line)? The
    cheap test a reply passes before the offered functions are looked up."""
    return NEED_PREFIX not in text and '"name"' in text


def calls_in_text(text: str, functions: Mapping[str, Rule]) -> list[dict[str, Any]]:
    """Tool calls a model wrote as JSON text instead of NEED lines, limited to the offered
    functions (none when the text has a NEED line or no JSON name at all)."""
    if not may_hold_calls(text):
        return []
    found = rules.parse_text_tool_calls(text, known=dict(functions))
    return [{"function": {"name": n, "arguments": a}} for n, a in found]


def need_lines(calls: list[dict[str, Any]], functions: Mapping[str, Rule]) -> str:
    """The lines that record ``calls`` in the reply: the call as the model made it, then the
    NEED its rule routes it to (its arguments healed), or the raw call for an unknown name."""
    lines: list[str] = []
    for i, call in enumerate(calls):
        fn = call.get("function") or {}
        name = str(fn.get("name") or "?")
        call_id = str(call.get("id") or f"call_{i}")
        rule = functions.get(name)
        args = rules.heal_arguments(fn.get("arguments"), rule.params if rule else ())
        need = rules.route_call(rule, args).need if rule else f"{name} {json.dumps(args)}"
        shown = json.dumps(args, ensure_ascii=False)
        lines.append(tool_call_lines(call_id, name, shown, need))
    return "".join(lines)
