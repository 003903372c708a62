"""Tool definitions serialised deterministically. Whatever order the tools, or the
keys of their schemas, come in, the request carries the same bytes (a server reuses its cache
only for a byte-identical prefix, and the tools are part of it)."""

from __future__ import annotations

import json
import random
from typing import Any

from contemplation.backends.base import PhaseTimeouts
from contemplation.backends.ollama import OllamaBackend
from contemplation.backends.openai import OpenAIBackend
from contemplation.models import ChatMessage, ChatRequest
from contemplation.prompt.toolspecs import canonical_tools


def spec(name: str, params: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Ask for: {name}",
            "parameters": {
                "type": "object",
                "properties": {p: {"type": "string", "description": p} for p in params},
                "required": params,
            },
        },
    }


T = PhaseTimeouts(connect=1, first_byte=1, idle=1, total=1)
TOOLS = [
    spec("read_file", ["path", "lines"]),
    spec("current_time", ["tz"]),
    spec("git_log", ["repo", "max_count"]),
    spec("search_nodes", ["query"]),
]


def shuffled(value: Any, rng: random.Random) -> Any:
    """``value`` with every dict's keys in a random order (lists keep theirs)."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {k: shuffled(value[k], rng) for k in keys}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


def bodies(tools: tuple[dict[str, Any], ...]) -> tuple[bytes, bytes]:
    request = ChatRequest(model="m", messages=(ChatMessage("user", "hi"),), tools=tools)
    ollama = OllamaBackend("http://127.0.0.1:9", timeouts=T).request_body(request)
    openai = OpenAIBackend("http://127.0.0.1:9/v1", timeouts=T).request_body(request)
    return json.dumps(ollama).encode(), json.dumps(openai).encode()


def test_any_order_of_tools_and_keys_gives_the_same_request_bytes() -> None:
    rng = random.Random(39)
    first = bodies(canonical_tools(TOOLS))
    seen = set()
    for _ in range(20):
        listed = [shuffled(t, rng) for t in TOOLS]
        rng.shuffle(listed)
        seen.add(json.dumps(listed))
        assert bodies(canonical_tools(listed)) == first
    assert len(seen) > 1  # the inputs did differ
    assert bodies(tuple(TOOLS)) != bodies(tuple(reversed(TOOLS)))  # (as sent before)


def test_tools_are_sorted_by_name_and_arrays_keep_their_order() -> None:
    tools = canonical_tools(reversed(TOOLS))
    assert [t["function"]["name"] for t in tools] == sorted(t["function"]["name"] for t in TOOLS)
    git = next(t for t in tools if t["function"]["name"] == "git_log")
    assert git["function"]["parameters"]["required"] == ["repo", "max_count"]
    assert list(git["function"]["parameters"]["properties"]) == ["max_count", "repo"]
