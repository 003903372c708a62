"""The turn's first phase, before a slot is awaited: the context sections (gathered once),
what the model can do (its window, vision, thinking, native tools) and what it is offered."""

from __future__ import annotations

from typing import Any

import structlog

from contemplation.backends.capabilities import cannot_chat, resolve_think
from contemplation.engine import tokenized
from contemplation.engine.provider import Provider
from contemplation.engine.turn.state import Prepared, Turn
from contemplation.errors import BackendError, ContemplationError
from contemplation.models import Metadata
from contemplation.prompt.context import saved_context
from contemplation.prompt.toolspecs import canonical_tools

log = structlog.get_logger("contemplation.turn")


async def prepare(turn: Turn, meta: Metadata, usable: list[Provider]) -> Prepared:
    """``meta`` as served (the alias's model, options and think); ``usable``: the providers
    the turn may land on. The request must fit the smallest window among them."""
    rt = turn.rt
    context = await _context(turn, meta)
    found = [await p.capabilities(meta.model) for p in usable]
    known = [c for c in found if c is not None]
    caps = known[0] if known else None  # None: the turn reports the error
    for c in known:  # an embedding or decision model: one ERROR, no request
        if (refused := cannot_chat(meta.model, c)) is not None:
            return Prepared(meta, context=context, error=refused)
    windows = [w for c in known if (w := c.request_window or c.context_length)]
    think: bool | str | None = meta.think
    note: str | None = None
    if caps is not None and meta.think is not None:
        try:
            think, note = resolve_think(
                caps, meta.think, rt.settings.think_unsupported, model=meta.model
            )
        except BackendError as exc:
            return Prepared(meta, context=context, error=exc)
    tools: tuple[dict[str, Any], ...] = ()
    if caps is not None and caps.tools and rt.settings.native_tools:
        try:
            tools = canonical_tools(rt.need_router().tool_specs(template=meta.template))
        except ContemplationError:
            tools = ()
    return Prepared(
        meta,
        context=context,
        tools=tools,
        think=think,
        note=note,
        window=min(windows) if windows else None,
        vision=all(c.vision for c in known),  # (unknown: let the server say)
        constrains=all(getattr(p.backend, "structured_output", False) for p in usable),
        tokenizer=next((p for p in usable if tokenized.counter([p.backend])), None),
    )


async def _context(turn: Turn, meta: Metadata) -> str:
    """The context sections for the system prompt (gathered once, then read from context/)."""
    if not meta.context_requirements:
        return ""
    saved = saved_context(turn.conv)
    if saved:
        return saved
    try:
        _, text = await turn.rt.context_assembler().assemble(turn.conv, meta.context_requirements)
    except (ContemplationError, OSError) as exc:
        log.warning("context_failed", conv=turn.conv.id, error=str(exc))
        return ""
    return text
