"""The model catalog: each configured provider's models and what they can do (tools,
thinking, vision, context window, slots) as the capability registry resolves them
(:mod:`contemplation.backends.capabilities`), and the aliases. Read by ``models``,
``aliases``, ``doctor`` and MCP ``models``: a catalog, not a command."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from contemplation import backends
from contemplation.backends import capabilities, providers
from contemplation.errors import BackendError, ConfigError
from contemplation.settings import Settings
from contemplation.store.layout import Home, list_conversations, read_metadata

if TYPE_CHECKING:  # aiohttp comes with the families: only when a caller talks to one
    from contemplation.backends.base import Backend

MAX_MODELS = 200  # per backend; the rest are counted, not described
AT_ONCE = 4  # capability look-ups in flight per backend
LOOKUP_S = 5.0  # the longest a face waits to learn whether a model can chat


def configured(settings: Settings, asked: tuple[str, ...]) -> list[str]:
    """The providers to list: those asked for (an alias: its providers), else the default,
    its fallbacks, every ``[providers.*]`` and those the active conversations use (as
    ``doctor`` checks them)."""
    names = list(asked) or [
        settings.default_backend,
        *settings.fallback,
        *settings.providers,
        *sorted(in_use(Home(settings.home))),
    ]
    out: list[str] = []
    for name in names:
        alias = settings.aliases.get(name)
        out.extend(alias.providers if alias is not None else [name])
    return list(dict.fromkeys(out))


def in_use(home: Home) -> set[str]:
    """The backends the active conversations name: one of them unreachable is a failure; any
    other unreachable backend is only worth a warning (``doctor``, ``models``)."""
    return {m.backend for c in list_conversations(home) if (m := read_metadata(c)) is not None}


async def _why(backend: Backend, exc: BackendError) -> str:
    """One line: the failed check's words and hint (as ``doctor`` says it), else the error."""
    try:
        checks = await backend.check(None)
    except Exception:  # the listing already failed; its own error says enough
        checks = []
    for c in checks:
        if not c.ok:
            return c.detail + "".join(f" ({h})" for h in c.hints[:1])
    return str(exc)


async def _describe(backend: Backend, model: str, room: asyncio.Semaphore) -> dict[str, Any]:
    async with room:
        try:
            caps = await backend.capabilities(model)
        except BackendError as exc:
            return {"name": model, "error": str(exc)}
    return {
        "name": model,
        "tools": caps.tools,
        "thinking": caps.thinking,
        "vision": caps.vision,
        "context_length": caps.context_length,
        "request_window": caps.request_window,
        "source": caps.source,
        "cannot_chat": caps.cannot_chat,  # "": it chats; else what the server says it is
    }


async def _one(settings: Settings, name: str) -> dict[str, Any]:
    try:
        backend = backends.build(name, settings, fallback=False)
    except ConfigError as exc:
        return {"backend": name, "ok": False, "error": str(exc)}
    try:
        try:
            names = await backend.models()
        except BackendError as exc:
            return {"backend": name, "ok": False, "error": await _why(backend, exc)}
        room = asyncio.Semaphore(AT_ONCE)
        rows = await asyncio.gather(*(_describe(backend, m, room) for m in names[:MAX_MODELS]))
        return {
            "backend": name,
            "ok": True,
            "models": list(rows),
            "more": max(0, len(names) - MAX_MODELS),
            **await _slots(backend),
        }
    finally:
        await backend.aclose()


async def _slots(backend: Backend) -> dict[str, Any]:
    """How many turns the provider takes at once, and where that figure came from."""
    from contemplation.backends.base import KnowsLimits

    if not isinstance(backend, KnowsLimits):
        return {"slots": backend.concurrency, "slots_from": "the backend"}
    try:
        found = await backend.slots()
    except BackendError as exc:
        return {"slots": backend.concurrency, "slots_from": f"not asked: {exc}"}
    return {"slots": found.count, "slots_from": found.source}


async def refusal(settings: Settings, backend: str, model: str) -> str | None:
    """Why a conversation with ``model`` on ``backend`` (a provider or an alias) is refused:
    its server says it cannot chat. None when it chats, or when no server can say
    within LOOKUP_S (the daemon asks again at its turn and writes the same ERROR)."""
    target = providers.target(settings, backend, model)
    for name in target.providers:
        try:
            found = backends.build(name, settings, fallback=False)
        except ConfigError:
            continue
        try:
            async with asyncio.timeout(LOOKUP_S):
                caps = await found.capabilities(target.model)
        except (BackendError, TimeoutError):
            continue
        finally:
            await found.aclose()
        refused = capabilities.cannot_chat(target.model, caps)
        return str(refused) if refused is not None else None
    return None


async def list_all(settings: Settings, names: list[str]) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(_one(settings, n) for n in names)))


def alias_rows(settings: Settings) -> list[dict[str, Any]]:
    return [
        {
            "alias": name,
            "model": a.model,
            "providers": list(a.providers),
            "options": dict(a.options),
            "think": a.think,
        }
        for name, a in sorted(settings.aliases.items())
    ]
