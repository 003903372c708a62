"""A JSON-RPC line's top-level members, read without descending into it (standard library
only: the stdio front reads lines with it before the MCP SDK is loaded).

Nested values are skipped by counting brackets, so a depth that stops a JSON parser costs
nothing here, and a line cut short (read up to a bound) still shows the members before the
cut.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from json import decoder
from typing import Final

NESTED: Final = object()  # a member whose value is an array or an object (not read)
_WS = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
_BRACKET = re.compile(r'["\[\]{}]')
# json's own scanner of a string (C): the text after an opening quote, to the closing one
scanstring: Callable[[str, int], tuple[str, int]] = decoder.scanstring  # type: ignore[attr-defined]


def _skip(line: str, pos: int) -> int:
    """The end of the array or object that opens at ``pos``, found by counting brackets
    (strings skipped whole): linear, whatever the depth."""
    depth = 0
    while (m := _BRACKET.search(line, pos)) is not None:
        pos = m.end()
        ch = m.group()
        if ch == '"':
            _, pos = scanstring(line, pos)
        elif ch in "[{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return pos
    raise ValueError("unclosed")


def _value(line: str, pos: int) -> tuple[object, int]:
    if line.startswith('"', pos):
        return scanstring(line, pos + 1)
    if line.startswith(("[", "{"), pos):
        return NESTED, _skip(line, pos)
    m = _SCALAR.match(line, pos)
    if m is None:
        raise ValueError("not a value")
    value: object = json.loads(m.group())
    return value, m.end()


def members(line: str) -> tuple[dict[str, object], bool] | None:
    """The top-level members of the JSON object ``line`` holds (a nested value as
    :data:`NESTED`) and whether the object was read to its end; what was read before a fault
    in it; None if it does not open with ``{``."""
    pos = _WS.match(line, 0).end()  # type: ignore[union-attr]  # matches the empty string
    if not line.startswith("{", pos):
        return None
    found: dict[str, object] = {}
    pos += 1
    try:
        while True:
            pos = _WS.match(line, pos).end()  # type: ignore[union-attr]
            if line.startswith("}", pos):
                return found, not line[pos + 1 :].strip()
            if not line.startswith('"', pos):
                break
            key, pos = scanstring(line, pos + 1)
            pos = _WS.match(line, pos).end()  # type: ignore[union-attr]
            if not line.startswith(":", pos):
                break
            pos = _WS.match(line, pos + 1).end()  # type: ignore[union-attr]
            found[key], pos = _value(line, pos)
            pos = _WS.match(line, pos).end()  # type: ignore[union-attr]
            if line.startswith(",", pos):
                pos += 1
            elif not line.startswith("}", pos):
                break
    except ValueError:
        pass
    return found, False
