"""Slot affinity: a conversation's turns name the llama-server slot that holds its
history (``id_slot``), so that two conversations taking turns on a 4-slot server each find
their whole previous prompt in the cache (the server's ``timings.cache_n``), never the
other's; on a server that copies slots (``--slot-save-path``), a burst of new conversations
takes every slot at once, each with the template's prefix copied into it, not prefilled. A
recording proxy on loopback sits between the daemon's runtime and the server."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from contemplation.engine.runtime import Runtime
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_metadata
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation, write_metadata
from tests import peers
from tests.conftest import run_burst
from tests.realpeers import LlamaServer


class Recorder:
    """Forwards every request to ``upstream`` as it is; keeps each chat request's body and
    the ``timings`` of its reply (the last streamed chunk that carries them)."""

    def __init__(self, upstream: str) -> None:
        self.chats: list[tuple[dict[str, Any], dict[str, Any]]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                self._forward(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def _forward(self, body: bytes | None) -> None:
                headers = {"Content-Type": "application/json"}
                with httpx.stream(
                    self.command, upstream + self.path, content=body, headers=headers, timeout=600
                ) as resp:
                    self.send_response(resp.status_code)
                    self.send_header("Content-Type", resp.headers.get("content-type", ""))
                    self.send_header("Connection", "close")
                    self.end_headers()
                    timings: dict[str, Any] = {}
                    for line in resp.iter_lines():
                        if line.startswith("data: {") and '"timings"' in line:
                            timings = json.loads(line[6:]).get("timings") or timings
                        self.wfile.write(line.encode() + b"\n")
                        self.wfile.flush()
                if body and self.path.endswith("chat/completions"):
                    recorder.chats.append((json.loads(body), timings))
                self.close_connection = True

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _recorded(slot_save: bool, kv_unified: bool = False) -> Iterator[Recorder]:
    gguf = peers.smollm2_gguf()
    server = LlamaServer(
        gguf, n_ctx=2048, n_parallel=4, slot_save=slot_save, kv_unified=kv_unified
    ).start()
    recorder = Recorder(server.url)
    try:
        yield recorder
    finally:
        recorder.stop()
        server.stop()


@pytest.fixture
def recorded() -> Iterator[Recorder]:
    yield from _recorded(slot_save=False)


@pytest.fixture
def copying() -> Iterator[Recorder]:
    """A 4-slot server started with ``--slot-save-path``: it copies a slot into another."""
    yield from _recorded(slot_save=True)


@pytest.fixture
def unified() -> Iterator[Recorder]:
    """A 4-slot server with one KV buffer for all slots, as llama-server runs when ``-np`` is
    left to it: at each new request it moves idle slots' prompts into its host-memory cache,
    so a slot named by ``id_slot`` no longer holds its last prompt."""
    yield from _recorded(slot_save=False, kv_unified=True)


def _conversation(home: Home, topic: str) -> Conv:
    conv = new_conversation(
        home, topic, template=load_template(home, "default"), model="smollm2", backend="openai"
    )
    meta = read_metadata(conv)
    assert meta is not None
    write_metadata(conv, meta.model_copy(update={"options": {"temperature": 0, "num_predict": 8}}))
    return conv


@pytest.mark.real
def test_two_conversations_taking_turns_each_keep_their_slot_and_its_cache(
    home: Home, recorded: Recorder, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(openai={"base_url": recorded.url}), home=home)
    convs = {"a": _conversation(home, "Folder queues"), "b": _conversation(home, "Log rotation")}
    for i in range(3):
        for conv in convs.values():
            drop_message(conv, f"In one short sentence, idea number {i}?")
            run_burst(rt)
    sent = recorded.chats
    assert len(sent) == 6, [b.get("id_slot") for b, _ in sent]
    slots = {
        name: [sent[j][0].get("id_slot") for j in range(k, 6, 2)]
        for k, name in [(0, "a"), (1, "b")]
    }
    assert all(isinstance(s, int) for ids in slots.values() for s in ids), slots
    assert len(set(slots["a"])) == 1 and len(set(slots["b"])) == 1, slots  # each keeps its own
    assert slots["a"][0] != slots["b"][0], slots  # an unused slot was free: no eviction
    for j in range(2, 6):  # turn k+1 finds turn k's whole prompt in its slot's cache
        before, now = sent[j - 2][1], sent[j][1]
        assert now["cache_n"] >= before["cache_n"] + before["prompt_n"] - 2, (j, before, now)


@pytest.mark.real
def test_where_the_server_keeps_no_named_slots_history_the_daemon_lets_it_pick(
    home: Home, unified: Recorder, make_settings: Callable[..., Settings]
) -> None:
    """Naming slots there made every later turn prefill its whole prompt (cache_n 0 on each
    of 6 turns, measured on this server); left to pick, the server restores a cached prompt
    (here the template's shared prefix: 209 of ~290 tokens)."""
    rt = Runtime(settings=make_settings(openai={"base_url": unified.url}), home=home)
    convs = [_conversation(home, "Folder queues"), _conversation(home, "Log rotation")]
    for i in range(4):
        for conv in convs:
            drop_message(conv, f"In one short sentence, idea number {i}?")
            run_burst(rt)
    sent = unified.chats
    assert len(sent) == 8
    named = [body.get("id_slot") for body, _ in sent]
    seen = [(body.get("id_slot"), t["cache_n"], t["prompt_n"]) for body, t in sent]
    assert named[:2] != [None, None] and named[-4:] == [None] * 4, seen  # named, then not
    shared = _shared_tokens(unified)
    assert all(cache_n >= shared - 2 for _, cache_n, _ in seen[-4:]), (shared, seen)


TOPICS = ["Folder queues", "Log rotation", "Crash safety", "Cache eviction", "Summaries"]
ASK = "In one short sentence, what is this about?"


def _shared_tokens(recorder: Recorder) -> int:
    """Tokens of the text every recorded system prompt starts with (the protocol and the
    template's text, up to the topic), as the server counts them."""
    systems = [body["messages"][0]["content"] for body, _ in recorder.chats]
    same = (i for i, chars in enumerate(zip(*systems, strict=False)) if len(set(chars)) > 1)
    shared = systems[0][: next(same, min(map(len, systems)))]
    assert len(shared) > 500, shared
    tokenized = httpx.post(f"{recorder.url}/tokenize", json={"content": shared}, timeout=30)
    return len(tokenized.json()["tokens"])


@pytest.mark.real
def test_a_burst_takes_every_slot_with_its_templates_prefix_copied_not_prefilled(
    home: Home, copying: Recorder, make_settings: Callable[..., Settings]
) -> None:
    """Measured before: of a burst's first turns on 4 slots, those sent to unused slots
    prefilled the template's prefix again (71 % of it reused in bench_prefix_cache), or
    waited on the slots that held it while the others idled."""
    rt = Runtime(settings=make_settings(openai={"base_url": copying.url}), home=home)
    convs = [_conversation(home, topic) for topic in TOPICS]
    drop_message(convs[0], ASK)
    run_burst(rt)  # the first fills one slot with the prefix
    for conv in convs[1:]:
        drop_message(conv, ASK)
    run_burst(rt)  # four at once
    sent = copying.chats
    assert len(sent) == 5, [b.get("id_slot") for b, _ in sent]
    n_shared = _shared_tokens(copying)
    burst = sent[1:]
    assert sorted(body["id_slot"] for body, _ in burst) == [0, 1, 2, 3], burst  # all at once
    for body, timings in burst:  # the prefix found in every slot: copied, not prefilled
        assert timings["cache_n"] >= n_shared - 2, (body["id_slot"], timings, n_shared)


@pytest.mark.real
def test_a_cold_burst_prefills_the_prefix_once_and_copies_it_into_the_other_slots(
    home: Home, copying: Recorder, make_settings: Callable[..., Settings]
) -> None:
    """Nothing warm, four at once: before, the three after the first queued behind it on
    its slot (or prefilled the prefix again in an unused one)."""
    rt = Runtime(settings=make_settings(openai={"base_url": copying.url}), home=home)
    for topic in TOPICS[:4]:
        drop_message(_conversation(home, topic), ASK)
    run_burst(rt)
    sent = copying.chats
    assert len(sent) == 4, [b.get("id_slot") for b, _ in sent]
    assert sorted(body["id_slot"] for body, _ in sent) == [0, 1, 2, 3], sent
    n_shared = _shared_tokens(copying)
    reused = sorted(timings["cache_n"] for _, timings in sent)
    assert reused[0] == 0 and all(n >= n_shared - 2 for n in reused[1:]), (reused, n_shared)
