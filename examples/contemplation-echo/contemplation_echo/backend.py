"""The ``echo`` backend: every reply is ``Echo: `` and the last message the agent's side sent.

A backend streams :class:`~contemplation.models.StreamEvent` pieces (``content``, then one
``done``), says what a model can do (``capabilities``), checks itself for ``doctor``, forgets
a conversation's server-side state (none here) and closes. Its own settings come from
``[plugins.echo]`` in config.toml (or a ``[providers.<name>]`` with ``kind = "echo"``),
checked by :class:`EchoSettings`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from pydantic import BaseModel, ConfigDict, Field

from contemplation.plugin import (
    BackendInputs,
    BackendKind,
    BackendSession,
    Capabilities,
    ChatRequest,
    Check,
    StreamEvent,
    Usage,
)


class EchoSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt key is refused with its name

    prefix: str = Field("Echo: ", description="what every reply starts with")
    delay: float = Field(0.0, ge=0, le=10, description="seconds between streamed pieces")


class EchoBackend:
    name = "echo"
    label = "ECHO"  # the model side's label in messages.log
    concurrency = 4  # turns at once

    def __init__(self, own: EchoSettings) -> None:
        self.own = own

    async def stream(self, request: ChatRequest) -> AsyncGenerator[StreamEvent, None]:
        said = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        for piece in (self.own.prefix, said):
            if self.own.delay:
                await asyncio.sleep(self.own.delay)
            yield StreamEvent("content", piece)
        yield StreamEvent("done", usage=Usage(prompt_eval_count=0, eval_count=len(said.split())))

    async def capabilities(self, model: str) -> Capabilities:
        return Capabilities(context_length=32_768, source="config")

    async def check(self, model: str | None) -> list[Check]:
        return [Check("echo", True, "answers at once (no server)")]

    async def models(self) -> list[str]:
        return ["echo"]  # any model name works; this is the one it suggests

    async def forget(self, conversation_id: str, session: BackendSession | None = None) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _make(made: BackendInputs) -> EchoBackend:  # made: settings, name (provider), own
    assert isinstance(made.own, EchoSettings)
    return EchoBackend(made.own)


echo = BackendKind("echo", _make, EchoSettings)
