"""The prompt in canonical order, so that a server's prefix cache is reused.

What every conversation shares comes first and never varies (the protocol, the NEED forms),
then the template's words, then the conversation's own (its topic, its context), then the
history oldest first, then the newest message. Two conversations of one template share their
request bytes up to the topic; turn k+1's request starts with turn k's plus its reply."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from contemplation.backends.base import phase_timeouts
from contemplation.backends.ollama import OllamaBackend
from contemplation.engine.runtime import Runtime
from contemplation.models import Metadata
from contemplation.prompt.prompts import NeedForm, build_request
from contemplation.settings import Settings, TimeoutSettings
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama, Step

NEEDS = (NeedForm("Brain memory about <topic>", "The memory store."), NeedForm("Ping <x>"))


def _wire(topic: str, template_prompt: str, context: str = "") -> str:
    """The body an Ollama backend sends for a first turn, as the bytes on the wire."""
    meta = Metadata(id=f"c-{topic}", topic=topic, created="", model="m")
    req = build_request(meta, (), template_prompt=template_prompt, needs=NEEDS, context=context)
    backend = OllamaBackend("http://127.0.0.1:1", timeouts=phase_timeouts(TimeoutSettings()))
    return json.dumps(backend.request_body(req), ensure_ascii=False)


def _shared(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_two_conversations_of_one_template_share_the_prompt_up_to_the_topic() -> None:
    words = "You review designs for {agent}: be blunt, cite evidence, and list open questions."
    a = _wire("Folder queues", words, context="## memory\nqueues are folders")
    b = _wire("Cache eviction", words, context="## memory\nLRU")
    shared = _shared(a, b)
    # everything before the topic is the same bytes: the protocol, the forms, the template's
    assert a.index("Folder queues") == shared == b.index("Cache eviction")
    head = a[:shared]
    assert "NEED: Brain memory about <topic>" in head and "=== COMPLETE ===" in head
    assert "You review designs for Claude: be blunt" in head
    # the order: protocol, then the template's words, then the topic, then the context
    assert head.index("NEED: Ping <x>") < head.index("You review designs")
    assert a.index("Folder queues") < a.index("queues are folders")


def test_no_template_words_still_share_everything_but_the_topic() -> None:
    a, b = _wire("Alpha", ""), _wire("Beta", "")
    assert a.index("Alpha") == _shared(a, b) == b.index("Beta")
    assert "Answer thoughtfully and concisely." in a[: _shared(a, b)]


def test_each_turn_s_request_starts_with_the_last_one_plus_its_reply(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """Turn k+1's messages are turn k's messages, then its reply, then what is new: a server
    that caches by prefix recomputes only the new tail (no compaction here)."""
    tpl = load_template(home, "research")
    conv = new_conversation(home, "prefix", template=tpl, model="llama3.2", backend="ollama")
    s = make_settings(fake_ollama)
    fake_ollama.enqueue(Step(text="First, the folder."))
    fake_ollama.enqueue(Step(text="I need more.\nNEED: Current state of queue"))
    fake_ollama.enqueue(Step(text="Then the rename."))
    for ask in ("How do queues work?", "And crash safety?"):
        drop_message(conv, ask)
        run_burst(Runtime(settings=s, home=Home(s.home)))
    sent: list[list[dict[str, Any]]] = [r["messages"] for r in fake_ollama.chat_requests()]
    assert len(sent) == 3  # the NEED's answer makes the third turn
    replies = [m["content"] for m in sent[-1] if m["role"] == "assistant"]
    assert replies == ["First, the folder.", "I need more.\nNEED: Current state of queue"]
    for before, after in zip(sent, sent[1:], strict=False):
        assert after[: len(before)] == before
        assert after[len(before)]["role"] == "assistant"  # the reply, then what is new
        # and as bytes: the serialised request grows at its end only
        old = json.dumps(before, ensure_ascii=False)[:-1]
        assert json.dumps(after, ensure_ascii=False).startswith(old)
