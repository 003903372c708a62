"""What a model can do: thinking, tools, vision, context length.

Precedence, most trusted first:

1. ``[capabilities."<model>"]`` in the config (per field; a field left out does not override);
2. what the server says (Ollama ``/api/show``, OpenCode ``/config/providers``,
   ``/v1/models`` metadata), passed in by the backend;
3. the family table below, matched on the model's base name;
4. nothing (a plain chat model).

Family matching happens here and only here (:func:`family_of`). The base name drops a provider
or organisation prefix (``local/``, ``Qwen/``), a directory, a ``.gguf`` suffix and an Ollama
``:tag``, and is lower-cased; the longest family prefix wins, so ``qwen3-vl`` beats ``qwen3``.

The table is a best guess for servers that cannot say (llama.cpp, vLLM, LM Studio, hosted
APIs). Sources: the Ollama library's capability tags and the model cards. When it is wrong
for a model you run, override it in the config rather than editing the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from contemplation.backends.base import Capabilities
from contemplation.errors import BackendError, ErrorKind
from contemplation.settings import CapabilityOverride


@dataclass(frozen=True, slots=True)
class Family:
    prefix: str
    thinking: bool = False
    tools: bool = False
    vision: bool = False


_T, _F = True, False
# prefix, thinking, tools, vision
FAMILIES: tuple[Family, ...] = tuple(
    Family(p, t, u, v)
    for p, t, u, v in (
        # thinking models (reasoning before the answer)
        ("qwen3", _T, _T, _F),
        ("qwen3-vl", _T, _T, _T),
        ("qwen3-coder", _F, _T, _F),  # the coder variants do not think
        ("qwq", _T, _T, _F),
        ("deepseek-r1", _T, _T, _F),
        ("deepseek-v3.1", _T, _T, _F),
        ("deepseek-v3.2", _T, _T, _F),
        ("magistral", _T, _T, _F),
        ("nemotron", _T, _T, _F),
        ("glm4", _T, _T, _F),
        ("glm-4", _T, _T, _F),
        ("gpt-oss", _T, _T, _F),  # levels low/medium/high; booleans are ignored
        ("phi4-reasoning", _T, _F, _F),
        ("phi4-mini-reasoning", _T, _F, _F),
        ("cogito", _T, _T, _F),
        ("exaone-deep", _T, _F, _F),
        ("openthinker", _T, _F, _F),
        ("smallthinker", _T, _F, _F),
        # tool-calling chat models
        ("llama3.1", _F, _T, _F),
        ("llama3.2", _F, _T, _F),
        ("llama3.3", _F, _T, _F),
        ("llama-3.1", _F, _T, _F),
        ("llama-3.2", _F, _T, _F),
        ("llama-3.3", _F, _T, _F),
        ("llama4", _F, _T, _T),
        ("qwen2.5", _F, _T, _F),
        ("qwen2", _F, _T, _F),
        ("mistral", _F, _T, _F),
        ("mistral-small3.1", _F, _T, _T),
        ("mistral-small3.2", _F, _T, _T),
        ("mixtral", _F, _T, _F),
        ("devstral", _F, _T, _F),
        ("command-r", _F, _T, _F),
        ("command-a", _F, _T, _F),
        ("granite3", _F, _T, _F),
        ("granite4", _F, _T, _F),
        ("hermes3", _F, _T, _F),
        ("firefunction", _F, _T, _F),
        ("phi4-mini", _F, _T, _F),
        # vision models
        ("llava", _F, _F, _T),
        ("bakllava", _F, _F, _T),
        ("llama3.2-vision", _F, _F, _T),
        ("gemma3", _F, _F, _T),
        ("qwen2.5vl", _F, _T, _T),
        ("qwen2.5-vl", _F, _T, _T),
        ("minicpm-v", _F, _F, _T),
        ("moondream", _F, _F, _T),
        ("granite3.2-vision", _F, _F, _T),
    )
)

THINK_LEVELS = ("low", "medium", "high", "max")


def base_name(model: str) -> str:
    """``Qwen/Qwen3-8B-GGUF`` → ``qwen3-8b-gguf``; ``local/qwq:32b`` → ``qwq``."""
    name = model.strip().replace("\\", "/").rsplit("/", 1)[-1]
    name = name.split(":", 1)[0]
    if name.lower().endswith(".gguf"):
        name = name[: -len(".gguf")]
    return name.lower()


def family_of(model: str) -> Family | None:
    """The table entry with the longest prefix of the model's base name (the one matcher)."""
    name = base_name(model)
    best: Family | None = None
    for fam in FAMILIES:
        if name.startswith(fam.prefix) and (best is None or len(fam.prefix) > len(best.prefix)):
            best = fam
    return best


def family_capabilities(model: str) -> Capabilities | None:
    fam = family_of(model)
    if fam is None:
        return None
    return Capabilities(
        thinking=fam.thinking, tools=fam.tools, vision=fam.vision, source="family table"
    )


def _override_for(
    model: str, overrides: Mapping[str, CapabilityOverride]
) -> CapabilityOverride | None:
    return overrides.get(model) or overrides.get(base_name(model))


def resolve(
    model: str,
    *,
    server: Capabilities | None = None,
    context_length: int | None = None,
    overrides: Mapping[str, CapabilityOverride] | None = None,
) -> Capabilities:
    """Merge the sources in precedence order (see the module docstring).

    ``server``: what the server reported, or None when it cannot say what the model does;
    ``context_length``: a window the server did report even so (e.g. from ``/v1/models``).
    """
    caps = server or family_capabilities(model) or Capabilities()
    if context_length is not None and caps.context_length is None:
        caps = replace(caps, context_length=context_length)
    ov = _override_for(model, overrides or {})
    if ov is None:
        return caps
    fields = {k: v for k, v in ov.model_dump().items() if v is not None}
    return replace(caps, **fields, source="config") if fields else caps


def normalize_think(value: bool | str | None) -> bool | str | None:
    """A ``think`` value from metadata: None, a bool, or a level; raise on anything else."""
    if value is None or isinstance(value, bool):
        return value
    text = value.strip().lower()
    if text in {"true", "on", "yes"}:
        return True
    if text in {"false", "off", "no", "none", ""}:
        return False
    if text in THINK_LEVELS:
        return text
    raise BackendError(
        f"think must be true, false or one of {', '.join(THINK_LEVELS)} (got {value!r})",
        transient=False,
        kind=ErrorKind.BAD_REQUEST,
    )


def resolve_think(
    caps: Capabilities, requested: bool | str | None, policy: str, *, model: str = ""
) -> tuple[bool | str | None, str | None]:
    """The ``think`` value to send, and a note for the log when it had to be dropped.

    ``policy`` is ``settings.think_unsupported``: ``"error"`` raises a permanent
    :class:`BackendError` (kind ``unsupported``), ``"downgrade"`` drops the request with a note.
    Asking a thinking model *not* to think, or asking nothing, always passes through.
    """
    value = normalize_think(requested)
    if value is None or value is False or caps.thinking:
        return value, None
    who = model or "this model"
    why = f"{who} cannot think (capabilities from {caps.source})"
    if policy == "error":
        raise BackendError(
            f"{why}; remove think from metadata.json, pick a thinking model, or set "
            'think_unsupported = "downgrade"',
            transient=False,
            kind=ErrorKind.UNSUPPORTED,
        )
    return None, f"{why}; think={value!r} was dropped for this reply"


def cannot_chat(model: str, caps: Capabilities) -> BackendError | None:
    """The one-line refusal of a conversation with a model its server says cannot chat (an
    embedding model, a ``decision`` one: no "completion" among its capabilities)."""
    if not caps.cannot_chat:
        return None
    return BackendError(
        f"{model} cannot hold a conversation: its server lists it as {caps.cannot_chat} "
        "(no completion); pick a model that chats (contemplation models)",
        transient=False,
        kind=ErrorKind.UNSUPPORTED,
    )
