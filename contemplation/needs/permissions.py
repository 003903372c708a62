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

Secrets are the exception to "the last match wins": the built-in list (:data:`SECRET_NAMES`
anywhere, the tool's own token and index, the configuration file) is lifted only by a root
or a rule that names the secret — ``tools.allowed_roots = ["~/.ssh"]``, ``"~/.ssh/**" =
"allow"``, ``"**/.env" = "allow"`` — never by a broad one (``"*"``, ``"~/**"``, the root
``~``). A refusal says which secret and how to name it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from contemplation.base.secret_names import SECRET_NAMES, own_secret
from contemplation.errors import ConfigError
from contemplation.models import ACTIONS, Action
from contemplation.needs.rules import MCP_TOOL_RE, tool_ok
from contemplation.needs.tools.parts import split_range

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
    secret: str = ""  # a built-in secret's name glob (".ssh") or absolute path; "": a rule
    note: str = ""  # what a refusal adds: which secret, and how to name it

    def shown(self) -> str:
        said = f'{self.key} "{self.pattern}" = "{self.action}"'
        return f"{said}; {self.note}" if self.note else said

    def describe(self) -> str:
        return f"{self.shown()} ({self.source})"


def permission(key: str, pattern: str, action: Action, source: str, home: str = "") -> Permission:
    return Permission(key, pattern, action, source, glob_regex(key), glob_regex(pattern, home))


# Never read for the model unless a root or a rule names them: :data:`SECRET_NAMES` (see
# contemplation.base.secret_names); the configuration file is added by path (:func:`defaults`).
_SPACE = re.compile(r"\s")


def _secret(name: str) -> Permission:
    """A built-in secret named ``name`` (a glob of one path component), anywhere."""
    body = "".join({"*": "[^/]*", "?": "[^/]"}.get(c, re.escape(c)) for c in name)
    regex = re.compile(f"(?:.*/)?{body}(?:/.*)?", re.DOTALL | re.IGNORECASE)
    return Permission("*", f"**/{name}", "deny", "built in", re.compile(".*"), regex, name)


def _secret_path(path: str, shown: str) -> Permission:
    """A built-in secret at one absolute path (the configuration file)."""
    regex = re.compile(f"{re.escape(path)}(?:/.*)?", re.DOTALL)
    return Permission("*", shown, "deny", "built in", re.compile(".*"), regex, path)


def _root(root: str, shown: str) -> Permission:
    """An allowed root as the rule it is for the secrets: it names those it lies in."""
    regex = re.compile(f"{re.escape(root.rstrip('/'))}(?:/.*)?", re.DOTALL)
    return Permission("*", shown, "allow", "tools.allowed_roots", re.compile(".*"), regex)


DEFAULT_PERMISSIONS: tuple[Permission, ...] = (
    permission("*", "*", "allow", "built in"),
    *(_secret(n) for n in SECRET_NAMES),
)


def defaults(
    *, home: str = "", configs: Iterable[Any] = (), roots: Iterable[Any] = ()
) -> tuple[Permission, ...]:
    """The built-in permissions for this configuration: :data:`DEFAULT_PERMISSIONS`, the
    configuration files as secrets, and each allowed root (``~`` is ``home``), which lifts
    the secrets it lies in or is."""
    out = list(DEFAULT_PERMISSIONS)
    for config in configs:
        path = os.path.abspath(_expand_home(str(config), home))
        out.append(_secret_path(path, _shown_path(path, home)))
        if (real := os.path.realpath(path)) != path:
            out.append(_secret_path(real, _shown_path(real, home)))
    for root in roots:
        path = os.path.normpath(_expand_home(str(root), home))
        out.append(_root(path, _shown_path(path, home)))
        if (real := os.path.realpath(path)) != path:
            out.append(_root(real, _shown_path(real, home)))
    return tuple(out)


def _shown_path(path: str, home: str) -> str:
    home = home.rstrip("/")
    if home and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home) :]
    return path


def _names(p: Permission, secret: Permission, home: str) -> bool:
    """Whether ``p`` names ``secret`` itself: a component of its pattern, as written, is the
    secret's name (``~/.ssh/**``, ``*.pem``), or its pattern lies at or under the secret's
    path. ``*``, ``**`` and ``~/**`` name none."""
    text = os.path.normpath(_expand_home(p.pattern, home)) if p.pattern else ""
    if secret.secret.startswith("/"):
        literal = re.split(r"[*?]", text, maxsplit=1)[0]
        return literal == secret.secret or literal.startswith(secret.secret.rstrip("/") + "/")
    glob = secret.secret.casefold()
    return any(fnmatch.fnmatchcase(part.casefold(), glob) for part in text.split("/") if part)


def _hint(secret: Permission, form: str, rule: str, tool: str, home: str) -> str:
    """Which secret ``form`` is and how to name it, for the refusal."""
    if secret.secret.startswith("/"):
        path = secret.secret
    else:
        parts = form.split("/")
        glob = secret.secret.casefold()
        found = (i for i, p in enumerate(parts) if fnmatch.fnmatchcase(p.casefold(), glob))
        at = next(found, len(parts) - 1)
        path = "/".join(parts[: at + 1])
    shown = _shown_path(path, home)
    said = f'"{shown}" is a secret on the built-in list: to let it be read, name it'
    if tool.startswith("files."):
        return f'{said}: tools.allowed_roots = ["{shown}"]'
    key = rule if re.fullmatch(r"[A-Za-z0-9_-]+", rule) else json.dumps(rule)
    return f'{said}: [permissions] {key} = {{ "{shown}" = "allow" }}'


def _own(form: str, home: str) -> Permission | None:
    """The built-in refusal of one of the tool's own secrets (:func:`own_secret`) that the
    path ``form`` is or lies in; None when it is none. Only a path can be one, as for
    :func:`_guarded`."""
    if not form or ("/" not in form and _SPACE.search(form)):
        return None
    why = own_secret(form.split("/"))
    if why is None:
        return None
    shown = _shown_path(form, home)
    return Permission("*", shown, "deny", "built in, not to be lifted", secret=form, note=why)


def _guarded(
    scoped: Sequence[Permission], form: str, rule: str, tool: str, home: str
) -> Permission | None:
    """The first built-in secret ``form`` is that no later permission names, marked with the
    hint; None when there is none. Only a path (a value with a ``/``, or one word) can be
    one: a question that mentions ``.ssh`` is not."""
    if not form or ("/" not in form and _SPACE.search(form)):
        return None
    for i, secret in enumerate(scoped):
        if not secret.secret or not secret.pattern_re.fullmatch(form):
            continue
        named = any(
            p.pattern_re.fullmatch(form) and _names(p, secret, home) for p in scoped[i + 1 :]
        )
        if not named:
            return replace(secret, note=_hint(secret, form, rule, tool, home))
    return None


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


def folded(value: str, home: str = "") -> str | None:
    """The file a path argument names, as one spelling: a trailing ``lines A-B`` left out,
    ``~`` expanded and ``..`` folded (``./a/../a/x.md`` is ``a/x.md``); None when folding
    climbs above where a relative path starts (``a/../../x``): it names no file in a root."""
    meant = posixpath.normpath(_expand_home(split_range(value)[0].strip(), home))
    if meant == ".." or meant.startswith("../"):
        return None
    return meant


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
        forms = _forms(value, home)
        if own := _own(forms[-1], home):  # the tool's own secrets: no root or rule lifts them
            return Verdict("deny", own, value)
        for form in forms:  # a secret is judged by what the value means: the last form
            secret = _guarded(scoped, form, rule, tool, home) if form is forms[-1] else None
            hit = secret or next(
                (p for p in reversed(scoped) if not p.secret and p.pattern_re.fullmatch(form)),
                None,
            )
            if hit is None:
                continue
            if worst.rule is None or _STRICTNESS[hit.action] > _STRICTNESS[worst.action]:
                worst = Verdict(hit.action, hit, value)
    return worst
