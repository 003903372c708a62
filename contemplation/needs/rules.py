"""Pure: the rule table that maps a ``NEED:`` to a tool and its arguments.

A rule matches a need by a case-insensitive ``prefix`` or by a regular expression ``match``
(whole need, case-insensitive unless ``case_sensitive = true``) with named captures. Rules are
tried in order and the first match wins: template rules, then ``[[routes]]`` from the config,
then the five defaults of the protocol. Arguments are templates filled from the captures and
from ``{need}`` (the whole need) and ``{rest}`` (what follows a prefix), e.g.
``args = {path = "{path}"}``.

Tools are named ``family.verb`` for the registered ones (:mod:`contemplation.needs.tools.registry`),
``server:tool`` for a tool of a configured MCP server, or ``agent`` (the agent answers).

Permissions (the second half): ``[permissions]`` says per rule or tool and argument pattern
whether a routed need may be looked up — allow, ask or deny, the last matching pattern winning
(:func:`compile_permissions`, :func:`decide`; see "permissions" below).

Everything here is data in, data out: no I/O, no asyncio. A bad rule raises
:class:`~contemplation.errors.ConfigError` naming the file, the rule's position and line, and
the reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contemplation.errors import ConfigError
from contemplation.models import ACTIONS, FUNCTION_RE, Action, Route, Rule
from contemplation.needs.tools import registry
from contemplation.needs.tools.base import PLACEHOLDER_RE, fill
from contemplation.needs.tools.registry import default_rules
from contemplation.protocol.logformat import canonical_need

MAX_NEED_CHARS = 1000
MAX_ARG_CHARS = 1000
_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MCP_TOOL_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*):([A-Za-z0-9_][A-Za-z0-9_./-]*)$")
_ROUTES_HEADER_RE = re.compile(r"^[ \t]*\[\[[ \t]*routes[ \t]*\]\]", re.MULTILINE)
_QUOTES = ("``", '""', "''", "<>", "“”", "‘’")  # noqa: RUF001 - typographic quotes on purpose

RULE_KEYS = {"name", "prefix", "match", "tool", "args", "param", "description", "case_sensitive"}


# --------------------------------------------------------------------------- compiling


def _placeholders(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        for m in PLACEHOLDER_RE.finditer(value):
            if m.group(1) is not None:
                yield m.group(1)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _placeholders(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _placeholders(v)


def _routes_lines(text: str | None) -> list[int]:
    if not text:
        return []
    return [text.count("\n", 0, m.start()) + 1 for m in _ROUTES_HEADER_RE.finditer(text)]


def _where(source: str, index: int, lines: Sequence[int], count: int) -> str:
    at = f"{source}: [[routes]] #{index + 1}"
    if len(lines) == count:
        at += f" (line {lines[index]})"
    return at


def tool_ok(tool: str, servers: Iterable[str]) -> str | None:
    """None when ``tool`` exists, else why not."""
    if tool in registry.kinds():
        return None
    m = MCP_TOOL_RE.match(tool)
    if m is None:
        known = ", ".join(sorted(registry.kinds()))
        return f"unknown tool {tool!r} (built in: {known}; or server:tool for an MCP server)"
    names = sorted(servers)
    if m.group(1) not in names:
        configured = ", ".join(names) if names else "none is configured"
        return (
            f"tool {tool!r} names MCP server {m.group(1)!r}, but there is no "
            f"[mcp_servers.{m.group(1)}] ({configured})"
        )
    return None


def compile_rule(
    raw: Mapping[str, Any], *, servers: Iterable[str] = (), where: str, default_name: str = "rule"
) -> Rule:
    """One rule from its TOML table; raises :class:`ConfigError` prefixed with ``where``."""

    def bad(reason: str) -> ConfigError:
        return ConfigError(f"{where}: {reason}")

    tool, param, case_sensitive = _checked_fields(raw, servers, bad)
    pattern, prefix, captures = _matcher(raw, param, case_sensitive, bad)
    args = raw.get("args", _default_args(tool, pattern, param))
    if not isinstance(args, Mapping):
        raise bad("'args' must be a table, e.g. args = { path = \"{path}\" }")
    allowed = captures | {"need", "rest"}
    for name in _placeholders(args):
        if not _IDENT_RE.match(name):
            raise bad(f"argument placeholder {{{name}}} is not a plain name")
        if name not in allowed:
            raise bad(
                f"argument placeholder {{{name}}} is not captured by the rule "
                f"(available: {', '.join('{' + a + '}' for a in sorted(allowed))})"
            )
    name = str(raw.get("name") or default_name)
    return Rule(
        name=name,
        tool=tool,
        args=dict(args),
        prefix=prefix,
        pattern=pattern,
        param=param,
        description=str(raw.get("description", "")),
        source=where,
    )


def _checked_fields(
    raw: Any, servers: Iterable[str], bad: Callable[[str], ConfigError]
) -> tuple[str, str, bool]:
    """The rule's table, field by field: (tool, param, case_sensitive)."""
    if not isinstance(raw, Mapping):
        raise bad(f"a rule must be a table, not {type(raw).__name__}")
    unknown = sorted(set(raw) - RULE_KEYS)
    if unknown:
        raise bad(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(RULE_KEYS))})")
    tool = raw.get("tool")
    if not isinstance(tool, str) or not tool:
        raise bad("missing field 'tool'")
    why = tool_ok(tool, servers)
    if why:
        raise bad(why)
    if (raw.get("prefix") is None) == (raw.get("match") is None):
        raise bad("a rule needs exactly one of 'prefix' or 'match'")
    for key in ("name", "description", "param"):
        if key in raw and not isinstance(raw[key], str):
            raise bad(f"'{key}' must be a string")
    case_sensitive = raw.get("case_sensitive", False)
    if not isinstance(case_sensitive, bool):
        raise bad("'case_sensitive' must be true or false")
    param = str(raw.get("param", registry.default_arg(tool) or "query"))
    if not _IDENT_RE.match(param):
        raise bad(f"'param' must be a plain name, not {param!r}")
    return tool, param, case_sensitive


def _matcher(
    raw: Mapping[str, Any], param: str, case_sensitive: bool, bad: Callable[[str], ConfigError]
) -> tuple[re.Pattern[str] | None, str, set[str]]:
    """(pattern, prefix, names it captures) of a rule with ``match`` or ``prefix``."""
    match = raw.get("match")
    if match is not None:
        if not isinstance(match, str) or not match:
            raise bad("'match' must be a non-empty regular expression")
        try:
            pattern = re.compile(match, 0 if case_sensitive else re.IGNORECASE)
        except re.error as exc:
            raise bad(f"bad regular expression {match!r}: {exc}") from None
        return pattern, "", set(pattern.groupindex)
    prefix = raw.get("prefix")
    if not isinstance(prefix, str) or not prefix.strip():
        raise bad("'prefix' must be a non-empty string")
    return None, prefix.strip(), {param}


def _default_args(tool: str, pattern: re.Pattern[str] | None, param: str) -> dict[str, Any]:
    """Arguments when a rule gives none: the built-in tool's one argument, or for an MCP tool
    the captures under their own names (``args = {}`` in the rule means really none)."""
    groups = list(pattern.groupindex) if pattern is not None else []
    key = registry.default_arg(tool)
    if key is None:
        if tool == "agent":
            return {}
        return {g: "{" + g + "}" for g in groups} if pattern is not None else {param: "{rest}"}
    value = "{rest}" if pattern is None else "{" + groups[0] + "}" if len(groups) == 1 else "{need}"
    return {key: value}


def compile_rules(
    raws: Sequence[Mapping[str, Any]] | None,
    *,
    source: str,
    text: str | None = None,
    servers: Iterable[str] = (),
) -> tuple[Rule, ...]:
    """Rules from a ``[[routes]]`` array; ``text`` (the file) gives line numbers."""
    if not raws:
        return ()
    if not isinstance(raws, Sequence) or isinstance(raws, str):
        raise ConfigError(f"{source}: routes must be an array of tables ([[routes]])")
    server_names = list(servers)
    lines = _routes_lines(text)
    return tuple(
        compile_rule(
            raw,
            servers=server_names,
            where=_where(source, i, lines, len(raws)),
            default_name=f"rule_{i + 1}",
        )
        for i, raw in enumerate(raws)
    )


# --------------------------------------------------------------------------- matching


def clean_need(need: str) -> str:
    """The need as matched: its canonical one-line form, capped at :data:`MAX_NEED_CHARS`."""
    return canonical_need(need)[:MAX_NEED_CHARS]


def clean_value(text: str) -> str:
    """A captured value: trimmed, unquoted (small models love backticks), capped."""
    value = text.strip().rstrip(".,;:").strip()
    for pair in _QUOTES:
        if len(value) >= 2 and value[0] == pair[0] and value[-1] == pair[-1]:
            value = value[1:-1].strip()
            break
    return value[:MAX_ARG_CHARS]


def _captures(rule: Rule, need: str) -> dict[str, str] | None:
    if rule.pattern is not None:
        m = rule.pattern.fullmatch(need)
        if m is None:
            return None
        found = {k: clean_value(v or "") for k, v in m.groupdict().items()}
        found.setdefault("rest", "")
        return found
    if not need.casefold().startswith(rule.prefix.casefold()):
        return None
    rest = need[len(rule.prefix) :]
    if rest[:1].isalnum() and rule.prefix[-1:].isalnum():
        return None  # "File contents ofx": the prefix must end at a word boundary
    value = clean_value(rest)
    return {"rest": value, rule.param: value}


def route(need: str, rules: Sequence[Rule]) -> Route | None:
    """The first rule that matches ``need`` and the arguments it builds; None: no rule."""
    text = clean_need(need)
    for rule in rules:
        found = _captures(rule, text)
        if found is None:
            continue
        values = {**found, "need": text}
        return Route(rule, text, rule.tool, fill(dict(rule.args), values), found)
    return None


def route_call(rule: Rule, arguments: Mapping[str, Any]) -> Route:
    """A route built from a native tool call's arguments instead of a need's text."""
    values = {p: clean_value(_as_text(arguments.get(p, ""))) for p in rule.params}
    need = rule.prefix + " " + values[rule.param] if rule.pattern is None else ""
    if not need:
        shown = ", ".join(f"{k}={v}" for k, v in values.items())
        need = clean_need(f"{rule.name}({shown})")
    text = clean_need(need)
    filled = {**values, "rest": values.get(rule.param, ""), "need": text}
    return Route(rule, text, rule.tool, fill(dict(rule.args), filled), values)


def missing_params(rule: Rule, arguments: Mapping[str, Any]) -> list[str]:
    return [p for p in rule.params if not _as_text(arguments.get(p, "")).strip()]


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class RuleTable:
    """Ordered rules; the first that matches wins."""

    rules: tuple[Rule, ...] = field(default_factory=default_rules)

    def route(self, need: str) -> Route | None:
        return route(need, self.rules)

    def with_first(self, rules: Sequence[Rule]) -> RuleTable:
        return RuleTable((*rules, *self.rules)) if rules else self

    def functions(self) -> dict[str, Rule]:
        """Rules offered as native tools, by function name (first one wins)."""
        out: dict[str, Rule] = {}
        for r in self.rules:
            fn = r.function
            if fn and fn not in out:
                out[fn] = r
        return out


def table(config_rules: Sequence[Rule] = (), template_rules: Sequence[Rule] = ()) -> RuleTable:
    return RuleTable((*template_rules, *config_rules, *default_rules()))


# --------------------------------------------------------------------------- native tools


def tool_spec(rule: Rule) -> dict[str, Any]:
    """A rule in the Ollama/OpenAI ``tools`` format."""
    params = rule.params
    desc = rule.description or (
        f"Ask for: {rule.prefix} <{rule.param}>"
        if rule.pattern is None
        else f"Ask for: {rule.name}"
    )
    return {
        "type": "function",
        "function": {
            "name": rule.function or rule.name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string", "description": p} for p in params},
                "required": list(params),
            },
        },
    }


def heal_arguments(raw: Any, params: Sequence[str] = ()) -> dict[str, Any]:
    """Tool-call arguments as a dict, whatever shape a small model sent them in.

    Accepts a dict, a JSON string, a JSON string of a JSON string (double-escaped), and for a
    one-parameter tool a bare string value. Anything else becomes ``{}``.
    """
    value = raw
    for _ in range(4):
        if not isinstance(value, str):
            break
        text = value.strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError:
            if text[:1] in '{["':
                return {}
            return {params[0]: text} if len(params) == 1 else {}
    if isinstance(value, dict):
        return {str(k): v for k, v in value.items()}
    if isinstance(value, str | int | float) and len(params) == 1:
        return {params[0]: str(value)}
    return {}


def _tool_call(obj: Any) -> tuple[str, Any] | None:
    if not isinstance(obj, dict):
        return None
    fn = obj.get("function")
    if isinstance(fn, dict):
        obj = fn
    name = obj.get("name") or obj.get("tool") or obj.get("tool_name")
    if not isinstance(name, str) or not FUNCTION_RE.match(name.strip()):
        return None
    args = obj.get("arguments", obj.get("parameters", obj.get("args", obj.get("input", {}))))
    return name.strip(), args


def parse_text_tool_calls(
    text: str, known: Iterable[str] | None = None, limit: int = 32
) -> list[tuple[str, dict[str, Any]]]:
    """Tool calls written as JSON in a plain-text reply.

    Recognises ``{"name": ..., "arguments": {...}}`` (or ``parameters``), the OpenAI
    ``{"function": {...}}`` shape, a list of those, ``{"tool_calls": [...]}``, with or without
    code fences or ``<tool_call>`` tags around them. With ``known``, other names are ignored.
    """
    allowed = set(known) if known is not None else None
    out: list[tuple[str, dict[str, Any]]] = []
    decoder = json.JSONDecoder()
    i = 0
    n = len(text)
    while i < n and len(out) < limit:
        start = min((p for p in (text.find("{", i), text.find("[", i)) if p >= 0), default=-1)
        if start < 0:
            break
        try:
            obj, end = decoder.raw_decode(text, start)
        except RecursionError:  # nested past the parser: no call in there; nor after it
            break
        except ValueError:
            i = start + 1
            continue
        items = (
            obj
            if isinstance(obj, list)
            else obj.get("tool_calls", [obj])
            if isinstance(obj, dict)
            else []
        )
        for item in items if isinstance(items, list) else []:
            call = _tool_call(item)
            if call is None:
                continue
            name, args = call
            if allowed is not None and name not in allowed:
                continue
            out.append((name, heal_arguments(args)))
        i = end
    return out[:limit]


__all__ = [  # the names a plugin uses (Rule) and the table's own
    "ACTIONS",
    "Action",
    "Route",
    "Rule",
    "RuleTable",
    "compile_rule",
    "compile_rules",
    "default_rules",
    "route",
    "route_call",
    "table",
]
