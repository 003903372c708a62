"""Permissions: whether a routed need may be looked up.

``[permissions]`` (global, then per template) says, per tool or rule, whether a routed need
may be looked up: ``allow``, ``ask`` (the agent approves first) or ``deny``. OpenCode's model:

    [permissions]
    read_file = { "*" = "allow", "~/secrets/**" = "ask" }
    "time:*" = "ask"

A key names a rule (``read_file``), a tool (``files.read``, ``server:tool``) or is a
pattern of them (``"*"``, ``"git:*"``); its value is one action (for every argument) or a
table of argument patterns to actions. The rules are tried in order — the built-in defaults,
then the config's, then the template's — and the last one that matches wins. Patterns:
``*`` and ``**`` match any run of characters (``/`` too), ``**/`` any run of whole folders
(none as well: ``**/.env`` matches ``.env``), ``?`` one character; a leading ``~/`` or
``$HOME/`` is the home folder. A need whose tool gets several arguments is decided per
argument and the strictest answer counts (deny, then ask, then allow).
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from contemplation.errors import ConfigError
from contemplation.models import ACTIONS, Action
from contemplation.needs.rules import MCP_TOOL_RE, tool_ok
from contemplation.tools.parts import split_range

_STRICTNESS = {"allow": 0, "ask": 1, "deny": 2}
_GLOB_RE = re.compile(r"\*\*/|\*\*|\*|\?|[^*?]+")


def glob_regex(pattern: str, home: str = "") -> re.Pattern[str]:
    """A permission pattern as a regular expression (whole value, case-sensitive)."""
    text = _expand_home(pattern, home)
    out: list[str] = []
    for m in _GLOB_RE.finditer(text):
        part = m.group(0)
        if part == "**/":
            out.append("(?:.*/)?")
        elif part in {"**", "*"}:
            out.append(".*")
        elif part == "?":
            out.append(".")
        else:
            out.append(re.escape(part))
    return re.compile("".join(out), re.DOTALL)


def _expand_home(text: str, home: str) -> str:
    if not home:
        return text
    for lead in ("~", "$HOME"):
        if text == lead or text.startswith(lead + "/"):
            return home.rstrip("/") + text[len(lead) :]
    return text


@dataclass(frozen=True, slots=True)
class Permission:
    """One ``pattern = action`` of the table, under the tool or rule it is written for."""

    key: str  # a rule or tool name, or a pattern of them
    pattern: str  # the argument pattern as written
    action: Action
    source: str = "built in"
    key_re: re.Pattern[str] = field(default=re.compile(".*"), compare=False, repr=False)
    pattern_re: re.Pattern[str] = field(default=re.compile(".*"), compare=False, repr=False)

    def shown(self) -> str:
        return f'{self.key} "{self.pattern}" = "{self.action}"'

    def describe(self) -> str:
        return f"{self.shown()} ({self.source})"


def permission(key: str, pattern: str, action: Action, source: str, home: str = "") -> Permission:
    return Permission(key, pattern, action, source, glob_regex(key), glob_regex(pattern, home))


DEFAULT_PERMISSIONS: tuple[Permission, ...] = (
    permission("*", "*", "allow", "built in"),
    permission("*", "**/.env", "deny", "built in"),
    permission("*", "**/.env.*", "deny", "built in"),
)


def compile_permissions(
    raw: Any,
    *,
    source: str,
    names: Iterable[str],
    servers: Iterable[str] = (),
    home: str = "",
) -> tuple[Permission, ...]:
    """The rules of one ``[permissions]`` table, in the order written. A plain key names one
    of ``names`` (rules and built-in tools) or ``server:tool`` of a configured MCP server; a
    key with ``*`` or ``?`` is a pattern of them. A bad table raises :class:`ConfigError`
    naming ``source`` and the key."""
    if raw is None:
        return ()
    where = f"{source}: [permissions]"
    if not isinstance(raw, Mapping):
        raise ConfigError(f'{where} must be a table, e.g. read_file = {{ "*" = "allow" }}')
    known = set(names)
    server_names = list(servers)
    out: list[Permission] = []
    for key, value in raw.items():
        if not isinstance(key, str) or not key.strip():
            raise ConfigError(f"{where}: a key must name a rule or a tool")
        if not any(c in key for c in "*?") and key not in known:
            m = MCP_TOOL_RE.match(key)
            if m is None:
                raise ConfigError(
                    f"{where}: {key!r} is no rule or tool (known: {', '.join(sorted(known))}; "
                    "or server:tool, or a pattern with *)"
                )
            why = tool_ok(key, server_names)
            if why:
                raise ConfigError(f"{where}: {why}")
        items = {"*": value} if isinstance(value, str) else value
        if not isinstance(items, Mapping):
            raise ConfigError(
                f'{where}: {key!r} must be "allow", "ask", "deny" or a table of argument '
                f"patterns, not {type(value).__name__}"
            )
        for pattern, action in items.items():
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError(f"{where}: {key!r} has an empty argument pattern")
            if action not in ACTIONS:
                raise ConfigError(
                    f'{where}: {key!r} "{pattern}" = {action!r} is not an action '
                    "(allow, ask or deny)"
                )
            out.append(permission(key, pattern, action, source, home))
    return tuple(out)


def subjects(arguments: Mapping[str, Any]) -> list[str]:
    """What the argument patterns are matched against: every scalar argument value (nested
    ones too), as text; ``[""]`` for a call without arguments."""
    found: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, Mapping):
            for x in v.values():
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)
        elif v is not None:
            found.append(v if isinstance(v, str) else json.dumps(v))

    walk(arguments)
    return found or [""]


def _forms(value: str, home: str) -> list[str]:
    """A value as written and, for a path, as meant (``~`` expanded, ``..`` folded, quotes
    and a trailing ``lines A-B`` left out as the file reader does: a part of a file is judged
    as the file)."""
    forms = [value]
    bare = split_range(value)[0]
    if bare != value:
        forms.append(bare)
    if "/" in bare or bare.startswith("~"):
        meant = posixpath.normpath(_expand_home(bare, home))
        if meant not in forms:
            forms.append(meant)
    return forms


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    rule: Permission | None = None  # the rule that decided (None: nothing matched; allowed)
    value: str = ""  # the argument it was decided on

    def why(self) -> str:
        return self.rule.describe() if self.rule is not None else "no permission rule matches"


def decide(
    rule: str, tool: str, arguments: Mapping[str, Any], perms: Sequence[Permission], home: str = ""
) -> Verdict:
    """allow / ask / deny for one routed need: per argument the last matching permission, and
    over the arguments the strictest of those."""
    scoped = [p for p in perms if p.key_re.fullmatch(rule) or p.key_re.fullmatch(tool)]
    worst = Verdict("allow")
    for value in subjects(arguments):
        for form in _forms(value, home):
            hit = next((p for p in reversed(scoped) if p.pattern_re.fullmatch(form)), None)
            if hit is None:
                continue
            if worst.rule is None or _STRICTNESS[hit.action] > _STRICTNESS[worst.action]:
                worst = Verdict(hit.action, hit, value)
    return worst
