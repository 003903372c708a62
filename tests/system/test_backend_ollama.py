"""The Ollama backend against the scripted fake server (real HTTP on loopback)."""

from __future__ import annotations

import asyncio
import time

import pytest

from contemplation.backends.base import PhaseTimeouts
from contemplation.backends.ollama import OllamaBackend
from contemplation.errors import BackendError
from contemplation.models import ChatMessage, ChatRequest, StreamEvent
from tests.fakes.ollama_server import FakeOllama, Step

FAST = PhaseTimeouts(connect=2, first_byte=2, idle=0.5, total=10)


def request(model: str = "llama3.2", **kw: object) -> ChatRequest:
    return ChatRequest(
        model=model,
        messages=(ChatMessage("system", "sys"), ChatMessage("user", "hello there")),
        **kw,
    )  # type: ignore[arg-type]


def collect(
    fake: FakeOllama, req: ChatRequest, timeouts: PhaseTimeouts = FAST, **kw: object
) -> list[StreamEvent]:
    async def go() -> list[StreamEvent]:
        b = OllamaBackend(fake.url, timeouts=timeouts, **kw)  # type: ignore[arg-type]
        try:
            return [ev async for ev in b.stream(req)]
        finally:
            await b.aclose()

    return asyncio.run(go())


def test_streams_content_thinking_tool_calls_and_usage(fake_ollama: FakeOllama) -> None:
    fake_ollama.enqueue(
        Step(
            text="The answer is 42.",
            thinking="Let me think.",
            tool_calls=[
                {"name": "read_file", "arguments": {"path": "a.md"}, "id": "call_p7o2gz50"}
            ],
        )
    )
    evs = collect(fake_ollama, request("qwen3", think=True))
    assert "".join(e.text for e in evs if e.kind == "content") == "The answer is 42."
    assert "".join(e.text for e in evs if e.kind == "thinking") == "Let me think."
    calls = [e.tool_call for e in evs if e.kind == "tool_call"]
    assert calls == [
        {
            "id": "call_p7o2gz50",
            "function": {"index": 0, "name": "read_file", "arguments": {"path": "a.md"}},
        }
    ]
    done = evs[-1]
    assert done.kind == "done" and done.usage is not None
    assert done.usage.eval_count and done.usage.prompt_eval_count
    assert done.usage.total_duration_ms == pytest.approx(4883.583458)
    assert done.usage.context_window == 8192


def test_request_always_carries_num_ctx_keep_alive_and_stream(fake_ollama: FakeOllama) -> None:
    collect(fake_ollama, request(options={"temperature": 0.1}), num_ctx=16384, keep_alive="30m")
    body = fake_ollama.chat_requests()[-1]
    assert body["stream"] is True
    assert body["options"] == {"num_ctx": 16384, "temperature": 0.1}
    assert body["keep_alive"] == "30m"
    assert "think" not in body
    assert body["messages"][0] == {"role": "system", "content": "sys"}


@pytest.mark.parametrize(
    ("step", "model", "transient", "kind", "text"),
    [
        (None, "nosuchmodel", False, "model_not_found", "model 'nosuchmodel' not found"),
        (
            Step(kind="error", status=503, error="server busy"),
            "llama3.2",
            True,
            "server_busy",
            "503",
        ),
        (
            Step(kind="error", status=500, error="runner crashed"),
            "llama3.2",
            True,
            "server_error",
            "runner crashed",
        ),
        (
            Step(kind="error", status=429, error="slow down", retry_after="7"),
            "llama3.2",
            True,
            "server_busy",
            "429",
        ),
        (
            Step(kind="mid_error", after_chunks=2),
            "llama3.2",
            True,
            "stream_error",
            "error was encountered",
        ),
        (Step(kind="no_done"), "llama3.2", True, "cut", "without a final done"),
        (Step(kind="cut_chunked", after_chunks=1), "llama3.2", True, "cut", ""),
        (Step(kind="cut_close", after_chunks=1), "llama3.2", True, "cut", "without a final done"),
        (Step(kind="garbage", after_chunks=1), "llama3.2", True, "protocol", "not JSON"),
        (
            Step(
                kind="error",
                status=400,
                error="the prompt is longer than the context length currently available to the model; shorten",
            ),
            "llama3.2",
            False,
            "context_overflow",
            "longer than the context",
        ),
    ],
)
def test_every_error_form_is_classified(
    fake_ollama: FakeOllama, step: Step | None, model: str, transient: bool, kind: str, text: str
) -> None:
    if step is not None:
        fake_ollama.enqueue(step)
    with pytest.raises(BackendError) as info:
        collect(fake_ollama, request(model))
    assert info.value.transient is transient
    assert info.value.kind == kind
    assert text in str(info.value)
    if step is not None and step.retry_after:
        assert info.value.retry_after == 7


def test_think_on_a_model_that_cannot_think_is_a_permanent_400(fake_ollama: FakeOllama) -> None:
    with pytest.raises(BackendError) as info:
        collect(fake_ollama, request("gemma", think=True))
    assert not info.value.transient and info.value.kind == "unsupported"
    assert "does not support thinking" in str(info.value)


def test_a_stall_between_chunks_is_detected_within_the_idle_timeout(
    fake_ollama: FakeOllama,
) -> None:
    fake_ollama.enqueue(Step(kind="hang", text="one two three", after_chunks=1))
    t0 = time.monotonic()
    with pytest.raises(BackendError) as info:
        collect(fake_ollama, request(), PhaseTimeouts(connect=2, first_byte=5, idle=0.3, total=10))
    assert info.value.kind == "stall" and info.value.transient
    assert time.monotonic() - t0 < 3


def test_a_slow_first_byte_is_waited_for_up_to_the_first_byte_timeout(
    fake_ollama: FakeOllama,
) -> None:
    fake_ollama.enqueue(Step(text="warm now", first_byte_delay=0.6))
    evs = collect(
        fake_ollama, request(), PhaseTimeouts(connect=2, first_byte=3, idle=0.2, total=10)
    )
    assert "".join(e.text for e in evs if e.kind == "content") == "warm now"
    fake_ollama.enqueue(Step(text="too slow", first_byte_delay=2))
    with pytest.raises(BackendError) as info:
        collect(
            fake_ollama, request(), PhaseTimeouts(connect=2, first_byte=0.5, idle=0.2, total=10)
        )
    assert info.value.kind == "timeout" and info.value.transient


def test_refused_connection_is_transient_unreachable() -> None:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def go() -> None:
        b = OllamaBackend(f"http://127.0.0.1:{port}", timeouts=FAST)
        try:
            async for _ in b.stream(request()):
                pass
        finally:
            await b.aclose()

    with pytest.raises(BackendError) as info:
        asyncio.run(go())
    assert info.value.transient and info.value.kind == "unreachable"


def test_capabilities_come_from_api_show_and_are_cached(fake_ollama: FakeOllama) -> None:
    async def go() -> tuple[object, object]:
        b = OllamaBackend(fake_ollama.url, timeouts=FAST)
        try:
            return await b.capabilities("qwen3"), await b.capabilities("qwen3")
        finally:
            await b.aclose()

    first, second = asyncio.run(go())
    assert first == second
    assert first.thinking and first.tools and first.context_length == 40960  # type: ignore[attr-defined]
    shows = [r for r in fake_ollama.requests if r["_path"] == "/api/show"]
    assert len(shows) == 1
