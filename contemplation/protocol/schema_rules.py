"""What a JSON Schema must be to be accepted: the rules that keep a schema from hurting the
daemon, checked wherever one is accepted (send, new --message, MCP, a template, a dropped
message's SCHEMA line), each broken rule one line (:func:`refusal`):

* nested at most :data:`MAX_DEPTH` levels (validators recurse with the nesting);
* no ``$ref`` that reaches itself without going into the reply (``{"$ref": "#"}``, or
  ``a`` → ``anyOf`` → ``b`` → ``a``: the same value checked again and again, endlessly).
  Recursion through a keyword that goes one level into the reply (:data:`DESCENDING`:
  ``properties``, ``items`` …) is legitimate (a tree: ``{"properties": {"children":
  {"items": {"$ref": "#"}}}}``) and accepted: each round checks a part one level down, so it
  ends with the reply, whose depth is bounded (``replycheck.MAX_DEPTH``), and the check runs
  in a child process with a time limit;
* its ``$ref`` entries expand, each up to where it goes into the reply, to at most
  :data:`MAX_EXPANDED` subschemas (forty ``$defs`` that each refer twice to the one below are
  2**40 checks of every reply);
* the reply check's engine (:mod:`contemplation.protocol.replycheck`) can use it: it is valid under
  its draft's meta-schema, every pattern is a linear-time regular expression (no lookaround,
  no backreferences, within the engine's size limit) and every ``$ref`` resolves within the
  schema (none is fetched).

The walks are iterative and linear in the schema's size, whatever its shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from contemplation.protocol import replycheck

MAX_DEPTH = 64  # levels of lists and objects in a schema's JSON
MAX_EXPANDED = 100_000  # subschemas a schema is, with each $ref replaced by what it names
REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
DATA_KEYS = frozenset({"const", "enum", "default", "examples"})  # values, not subschemas
# objects whose keys are names and whose values are schemas (a property may be called "enum")
NAME_MAPS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
# a schema's keywords whose subschemas check the parts of the value (one level down): a $ref
# that reaches itself through one of them is recursion bounded by the reply's depth
DESCENDING = frozenset(
    {
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "items",
        "prefixItems",
        "additionalItems",
        "unevaluatedItems",
        "contains",
    }
)

Pointer = tuple[str, ...]


def too_deep(schema: Any, what: str) -> str | None:
    if replycheck.nesting(schema, MAX_DEPTH) > MAX_DEPTH:
        return f"{what} is nested more than {MAX_DEPTH} levels deep (the limit)"
    return None


def refusal(schema: Mapping[str, Any], what: str) -> str | None:
    """Why ``schema`` (at most :data:`MAX_DEPTH` deep) cannot be accepted: not a valid JSON
    Schema, or one that breaks a rule; None: it can."""
    if (why := _engine_refusal(schema, what)) is not None:
        return why
    graph = _Graph(schema)
    looped = graph.cycle()
    if looped is not None:
        holder, ref = looped
        return (
            f"{what}'s $ref at {_shown(holder)} refers back to itself ({ref}) without going "
            "into the value (recursion through properties, items … is fine)"
        )
    if graph.expanded() > MAX_EXPANDED:
        return f"{what}'s $refs expand to more than {MAX_EXPANDED} subschemas"
    return None


def _engine_refusal(schema: Mapping[str, Any], what: str) -> str | None:
    """What the engine says of ``schema``: not valid under its draft's meta-schema, a pattern
    it cannot run, a $ref it cannot resolve (it fetches none). Its meta-schema check is ~100
    times faster than Python jsonschema's ``check_schema`` (0.33 s for 600 properties), and
    a dropped message's schema is checked on the daemon's loop."""
    import jsonschema_rs

    try:
        replycheck.validator(schema)
    except jsonschema_rs.ReferencingError as exc:
        return f"{what} cannot be used: {replycheck.engine_message(exc)}"
    except jsonschema_rs.ValidationError as exc:
        message = replycheck.engine_message(exc)
        path = list(exc.instance_path)
        at = f" (at {replycheck.where(path)})" if path else ""
        if isinstance(exc.kind, jsonschema_rs.ValidationErrorKind.Referencing):
            return f"{what} cannot be used: {message}"
        if path and (path[-1] == "pattern" or (len(path) > 1 and path[-2] == "patternProperties")):
            return (
                f"{what}'s pattern at {replycheck.where(path)} cannot be used: {message} "
                "(patterns run in linear time: no lookaround, no backreferences, within a "
                "size limit)"
            )
        return f"{what} is not a valid JSON Schema: {message}{at}"
    return None


def _shown(pointer: Pointer) -> str:
    return "/" + "/".join(pointer)


class _Graph:
    """The schema as a graph: each object or list a vertex, with an edge to each part of it
    that checks the same value (not through a :data:`DESCENDING` keyword) and from each
    ``$ref`` to what it names (resolved within the schema: a JSON pointer, an anchor, an
    embedded ``$id``). A cycle is a ``$ref`` that reaches itself without going into the
    value. Every vertex is a start: a part reached only through a descending keyword is
    checked against parts of the value of its own."""

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self.root = schema
        self.pointer: dict[int, Pointer] = {}
        self.parts: dict[int, list[Any]] = {}
        self.refs: dict[int, list[tuple[str, Any]]] = {}  # ref text, and what it names
        self.resources: dict[str, Any] = {}
        self.anchors: dict[tuple[str, str], Any] = {}
        self.order: list[Any] = []  # every vertex, each after all it leads to (by cycle())
        self.nodes: list[Any] = []  # every vertex, the root first
        pending: list[tuple[dict[str, Any], str]] = []
        todo: list[tuple[Any, Pointer, str, bool]] = [(schema, (), "", False)]
        while todo:
            node, at, base, named_map = todo.pop()
            if id(node) in self.pointer:
                continue
            self.pointer[id(node)] = at
            items: list[tuple[str, Any]]
            if isinstance(node, dict):
                if not named_map:  # a schema (not a map of names to schemas)
                    base = self._names(node, base, root=not at)
                    if any(isinstance(node.get(k), str) for k in REF_KEYS):
                        pending.append((node, base))
                items = [(k, v) for k, v in node.items() if named_map or k not in DATA_KEYS]
            else:
                items = [(str(i), v) for i, v in enumerate(node)]
            self.nodes.append(node)
            parts = self.parts[id(node)] = []
            for key, value in reversed(items):
                if isinstance(value, dict | list):
                    schema_key = not named_map and isinstance(node, dict)
                    if not (schema_key and key in DESCENDING):
                        parts.append(value)
                    child_map = schema_key and key in NAME_MAPS
                    todo.append((value, (*at, _escaped(key)), base, child_map))
            parts.reverse()
        for node, base in pending:
            named = [(node[k], self._resolve(node[k], base)) for k in REF_KEYS if k in node]
            self.refs[id(node)] = [(ref, target) for ref, target in named if target is not None]

    def _names(self, node: Mapping[str, Any], base: str, *, root: bool) -> str:
        """The base URI inside ``node``, recording the resource or anchors it names."""
        ident = node.get("$id")
        if isinstance(ident, str) and not ident.startswith("#"):
            base = urldefrag(urljoin(base, ident))[0]
            self.resources[base] = node
        elif isinstance(ident, str):  # draft 7 and before: "$id": "#name" is an anchor
            self.anchors[(base, ident[1:])] = node
        if root:
            self.resources.setdefault("", node)
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
                self.anchors[(base, node[key])] = node
        return base

    def _resolve(self, ref: str, base: str) -> Any:
        """What ``ref`` names within the schema (an object, list or boolean); None: nothing
        here (left to the engine, which refuses what it cannot resolve)."""
        url, fragment = urldefrag(urljoin(base, ref))
        node = self.resources.get(url)
        if node is None:
            return None
        fragment = unquote(fragment)
        if not fragment.startswith("/"):
            return self.anchors.get((url, fragment)) if fragment else node
        for token in fragment[1:].split("/"):
            step = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and step in node:
                node = node[step]
            elif isinstance(node, list) and step.isdigit() and int(step) < len(node):
                node = node[int(step)]
            else:
                return None
        return node

    def _next(self, node: Any) -> list[tuple[Any, str | None]]:
        """Where ``node`` leads: its parts, then what its $refs name (with the ref's text),
        in reverse (the stack pops the first one first)."""
        found: list[tuple[Any, str | None]] = [(p, None) for p in self.parts.get(id(node), [])]
        found += [(t, ref) for ref, t in self.refs.get(id(node), []) if isinstance(t, dict | list)]
        found.reverse()
        return found

    def cycle(self) -> tuple[Pointer, str] | None:
        """The first ``$ref`` found to reach itself (without going into the value): where
        it is, and its text. Every vertex is visited once, from the root on."""
        state: dict[int, int] = {}  # 1: on the current path, 2: done
        for start in self.nodes:
            if id(start) in state:
                continue
            state[id(start)] = 1
            stack: list[tuple[Any, list[tuple[Any, str | None]]]] = [(start, self._next(start))]
            while stack:
                node, ahead = stack[-1]
                if not ahead:
                    stack.pop()
                    state[id(node)] = 2
                    self.order.append(node)
                    continue
                nxt, ref = ahead.pop()
                seen = state.get(id(nxt))
                if seen == 1:  # a cycle, which only a $ref edge can close
                    return self.pointer[id(node)], ref or ""
                if seen is None:
                    state[id(nxt)] = 1
                    stack.append((nxt, self._next(nxt)))
        return None

    def expanded(self) -> int:
        """The most subschemas one value is checked against at one level: the largest part
        of the schema with its $refs replaced, up to where it goes into the value (counted
        up to :data:`MAX_EXPANDED` + 1). Only after :meth:`cycle` found none."""
        size: dict[int, int] = {}
        for node in self.order:
            total = 1 + sum(size.get(id(n), 1) for n, _ in self._next(node))
            size[id(node)] = min(total, MAX_EXPANDED + 1)
        return max(size.values(), default=1)


def _escaped(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
