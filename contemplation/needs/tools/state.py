"""``Current state of <thing>``: the recorded state of a thing, from a store like memory's.

An exact key (case and spacing ignored) wins; otherwise the closest entries are offered as
such, and with nothing close the answer lists a few things that do have a recorded state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from contemplation.needs.tools.base import ToolResult, text_arg
from contemplation.needs.tools.memory import JsonStore


class StateLookup:
    name = "state.get"

    def __init__(self, store: JsonStore) -> None:
        self.store = store

    async def call(self, arguments: Mapping[str, Any]) -> ToolResult:
        thing = text_arg(arguments, "thing")
        return await asyncio.to_thread(self.answer, thing)

    def answer(self, thing: str) -> ToolResult:
        src = str(self.store.path)
        exact = self.store.get(thing)
        if exact is not None:
            when = f" (recorded {exact.updated})" if exact.updated else ""
            return ToolResult(f"{exact.key}{when}: {exact.value}", src)
        close = self.store.search(thing, 3)
        if close:
            lines = [f"no state recorded for {thing!r} itself; the closest recorded:"]
            lines += [f"- {e.key} ({e.updated}): {e.value}" for _, e in close]
            return ToolResult("\n".join(lines), src, note="closest matches, not an exact one")
        known = sorted(e.key for e in self.store.load().values())
        listing = ", ".join(known[:20]) + (" …" if len(known) > 20 else "")
        text = f"no state recorded for {thing!r}" + (f"; recorded: {listing}" if known else "")
        return ToolResult(text, src)
