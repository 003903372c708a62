"""Conversation templates: ``<home>/templates/<name>/template.toml`` (and its
``system_prompt.md``), else the shipped copy. This module never writes."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from contemplation.errors import ConfigError, InputRejected, NotFound
from contemplation.protocol import escalation, structured
from contemplation.store.layout import Home, valid_id

PromptMode = Literal["add", "replace"]
PROMPT_MODES: tuple[PromptMode, ...] = ("add", "replace")
MAX_TEMPLATE_REQUIREMENTS = 20
_COMMENT_RE = re.compile(r"<!--.*?-->[ \t]*\n?", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Template:
    name: str
    model: str | None = None
    backend: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    models: tuple[str, ...] = ()  # a panel: every message answered by each of these models
    system_prompt: str = ""  # adds to the protocol, or replaces it (prompt_mode)
    think: bool | str | None = None
    archive_on_complete: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # routes, permissions, ...
    description: str = ""
    prompt_mode: PromptMode = "add"
    context_requirements: tuple[dict[str, Any], ...] = ()
    folder: Path | None = None  # where it was read from
    shipped: bool = False  # the package's copy: the home has no template of this name

    @property
    def schema(self) -> dict[str, Any] | None:
        """The JSON Schema every reply must match (``schema``; checked when read)."""
        value = self.extra.get("schema")
        if isinstance(value, str):
            loaded = json.loads(value)
            return loaded if isinstance(loaded, dict) else None
        return value if isinstance(value, dict) else None

    def requirements_for(self, topic: str) -> list[dict[str, Any]]:
        """The context requirements a new conversation about ``topic`` gets from this
        template, with ``{topic}`` filled in every text value."""
        return [_fill_topic(req, topic) for req in self.context_requirements]


def _fill_topic(value: Any, topic: str) -> Any:
    if isinstance(value, str):
        return value.replace("{topic}", topic)
    if isinstance(value, dict):
        return {k: _fill_topic(v, topic) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill_topic(v, topic) for v in value]
    return value


TEMPLATE_KEYS = frozenset({
    "model", "models", "backend", "options", "think", "archive_on_complete", "system_prompt",
    "system_prompt_file", "routes", "permissions", "description", "prompt_mode",
    "context_requirements", "schema", "escalate", "sticky",
})  # fmt: skip
_TEMPLATE_FIELDS = {
    "model", "models", "backend", "options", "think", "archive_on_complete", "description",
    "prompt_mode", "context_requirements",
}  # fmt: skip


def template_dirs(home: Home) -> dict[str, tuple[Path, bool]]:
    """Every template by name: its folder and whether it is the shipped copy (a template in
    the home hides the shipped one of the same name). Sorted by name."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, shipped in ((home.templates, False), (shipped_templates(), True)):
        try:
            entries = sorted(folder.iterdir())
        except OSError:
            continue
        for d in entries:
            if valid_id(d.name) and (d / "template.toml").is_file():
                found.setdefault(d.name, (d, shipped))
    return dict(sorted(found.items()))


def load_template(home: Home, name: str) -> Template:
    """``templates/<name>/template.toml`` (+ ``system_prompt.md``), else the shipped one.
    A template that cannot be used raises :class:`ConfigError` naming the file and the key."""
    if not valid_id(name):
        raise NotFound(f"not a template name: {name!r}")
    for d, shipped in ((home.templates / name, False), (shipped_templates() / name, True)):
        if (d / "template.toml").is_file():
            return _read_template(name, d, shipped=shipped)
    raise NotFound(f"no template named {name!r} (looked in {home.templates})")


def _read_template(name: str, d: Path, *, shipped: bool) -> Template:
    toml_path = d / "template.toml"
    try:
        data = tomllib.loads(toml_path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot parse template {toml_path}: {exc}") from exc
    unknown = sorted(set(data) - TEMPLATE_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} in template {toml_path}; known keys: "
            f"{', '.join(sorted(TEMPLATE_KEYS))}"
        )
    _check_template_values(data, toml_path)
    prompt = _template_prompt(data, d, toml_path)  # takes the prompt keys out of data
    return Template(
        name=name,
        model=data.get("model"),
        models=tuple(data.get("models", ())),
        backend=data.get("backend"),
        options=dict(data.get("options", {})),
        system_prompt=prompt,
        think=data.get("think"),
        archive_on_complete=data.get("archive_on_complete"),
        extra={k: v for k, v in data.items() if k not in _TEMPLATE_FIELDS},
        description=data.get("description", "").strip(),
        prompt_mode=data.get("prompt_mode", "add"),
        context_requirements=tuple(dict(r) for r in data.get("context_requirements", [])),
        folder=d,
        shipped=shipped,
    )


def _template_prompt(data: dict[str, Any], d: Path, toml_path: Path) -> str:
    """The template's own prompt text: ``system_prompt``, else its file; HTML comments
    (``<!-- … -->``) are notes for whoever edits the file and are not sent."""
    prompt = data.pop("system_prompt", None)
    file_name = data.pop("system_prompt_file", "system_prompt.md")
    if not isinstance(file_name, str) or not file_name or "/" in file_name:
        raise ConfigError(
            f"invalid system_prompt_file in template {toml_path}: a file name in the "
            "template's folder"
        )
    if prompt is None:
        try:
            prompt = (d / file_name).read_text(encoding="utf-8")
        except FileNotFoundError:
            prompt = ""
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {d / file_name}: {exc}") from exc
    elif not isinstance(prompt, str):
        raise ConfigError(f"invalid system_prompt in template {toml_path}: must be a string")
    return _COMMENT_RE.sub("", prompt).strip()


_TEMPLATE_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "models": (list,),
    "backend": (str,),
    "description": (str,),
    "options": (dict,),
    "archive_on_complete": (bool,),
    "think": (bool, str),
    "routes": (list,),
    "permissions": (dict,),
    "context_requirements": (list,),
    "schema": (dict, str),  # a JSON Schema every reply must match (structured.py)
    "escalate": (list,),  # the escalation ladder (protocol/escalation.py)
    "sticky": (bool,),
}


def _check_template_values(data: dict[str, Any], toml_path: Path) -> None:
    """Each known key's form; one line naming the key and the file."""
    for key, types in _TEMPLATE_TYPES.items():
        if key in data and not isinstance(data[key], types):
            wanted = " or ".join(_TOML_NAMES[t] for t in types)
            raise ConfigError(
                f"invalid {key} in template {toml_path}: must be {wanted}, "
                f"not {type(data[key]).__name__}"
            )
    if not all(isinstance(m, str) and m.strip() for m in data.get("models", [])):
        raise ConfigError(
            f"invalid models in template {toml_path}: a list of model names, e.g. "
            'models = ["qwen3:8b", "gemma3:4b"]'
        )
    mode = data.get("prompt_mode", "add")
    if mode not in PROMPT_MODES:
        raise ConfigError(
            f'invalid prompt_mode in template {toml_path}: {mode!r}; use "add" (the '
            'template\'s prompt is added to the protocol instructions) or "replace"'
        )
    try:
        escalation.parse(data.get("escalate", []), aliases=None, own=str(data.get("model", "")))
    except escalation.LadderError as exc:
        raise ConfigError(f"invalid escalate in template {toml_path}: {exc}") from None
    try:
        structured.template_schema(data.get("schema"))
    except InputRejected as exc:
        raise ConfigError(f"invalid schema in template {toml_path}: {exc}") from None
    reqs = data.get("context_requirements", [])
    if len(reqs) > MAX_TEMPLATE_REQUIREMENTS:
        raise ConfigError(
            f"invalid context_requirements in template {toml_path}: {len(reqs)} entries; "
            f"at most {MAX_TEMPLATE_REQUIREMENTS}"
        )
    for n, req in enumerate(reqs, 1):
        if not isinstance(req, dict) or not isinstance(req.get("type"), str):
            raise ConfigError(
                f"invalid context_requirements in template {toml_path}: entry {n} must be a "
                'table with a "type", e.g. { type = "notes", query = "{topic}" }'
            )


_TOML_NAMES: dict[type, str] = {
    str: "a string",
    dict: "a table",
    bool: "true or false",
    list: "an array",
}


def shipped_templates() -> Path:
    """The templates that ship with the package (copied into a new home's templates/)."""
    return Path(str(resources.files("contemplation").joinpath("skeleton", "templates")))
