"""The OpenAI-compatible backend: a scripted SSE server for the protocol, real llama.cpp for proof."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from contemplation.backends.base import PhaseTimeouts
from contemplation.backends.openai import OpenAIBackend, normalize_base_url
from contemplation.engine.pipeline import Runtime
from contemplation.errors import BackendError, ContextOverflow
from contemplation.models import BlockKind, ChatMessage, ChatRequest, StreamEvent
from contemplation.protocol.parser import parse
from contemplation.settings import CapabilityOverride, Settings
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import realpeers
from tests.conftest import run_burst
from tests.fakes.openai_server import FakeOpenAI, Step

FAST = PhaseTimeouts(connect=2, first_byte=5, idle=5, total=30)


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


def request(text: str = "hello", **kw: Any) -> ChatRequest:
    msgs = (ChatMessage("system", "be brief"), ChatMessage("user", text))
    return ChatRequest(kw.pop("model", "fake-model"), msgs, **kw)


def collect(url: str, req: ChatRequest, **kw: Any) -> list[StreamEvent]:
    async def go() -> list[StreamEvent]:
        b = OpenAIBackend(url, timeouts=kw.pop("timeouts", FAST), **kw)
        try:
            return [ev async for ev in b.stream(req)]
        finally:
            await b.aclose()

    return asyncio.run(go())


def fails(url: str, req: ChatRequest, **kw: Any) -> BackendError:
    with pytest.raises(BackendError) as info:
        collect(url, req, **kw)
    return info.value


def text_of(events: list[StreamEvent], kind: str = "content") -> str:
    return "".join(e.text for e in events if e.kind == kind)


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1"),
        ("localhost:1234", "http://localhost:1234/v1"),
        ("https://api.example.com/api/openai/v1", "https://api.example.com/api/openai/v1"),
    ],
)
def test_base_url_works_with_or_without_v1(given: str, expected: str) -> None:
    assert normalize_base_url(given) == expected


def test_a_streamed_reply_with_usage_and_the_request_it_came_from(fake: FakeOpenAI) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    fake.enqueue(Step(pieces=["Hel", "lo", " there"], usage=usage))
    req = request(options={"temperature": 0, "num_predict": 16, "num_ctx": 4096}, think="max")
    events = collect(f"{fake.url}/v1", req, api_key="sk-test")
    assert text_of(events) == "Hello there"
    done = events[-1]
    assert done.kind == "done" and done.usage is not None
    assert done.usage.prompt_eval_count == 12 and done.usage.eval_count == 3
    assert done.usage.done_reason == "stop" and done.usage.first_token_ms is not None
    sent = fake.chat_requests()[0]
    assert sent["_headers"]["Authorization"] == "Bearer sk-test"
    assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
    assert sent["max_tokens"] == 16 and sent["temperature"] == 0 and "num_ctx" not in sent
    assert sent["reasoning_effort"] == "high"
    assert [m["role"] for m in sent["messages"]] == ["system", "user"]


def test_the_base_url_without_v1_reaches_the_same_endpoint(fake: FakeOpenAI) -> None:
    events = collect(fake.url, request("hi"))
    assert text_of(events) == "Echo: hi"
    assert fake.chat_requests()[0]["_path"] == "/v1/chat/completions"


def test_think_false_asks_for_no_reasoning_and_no_api_key_sends_no_header(
    fake: FakeOpenAI,
) -> None:
    collect(fake.url, request(think=False))
    sent = fake.chat_requests()[0]
    assert sent["reasoning_effort"] == "none"
    assert "Authorization" not in sent["_headers"]


# --------------------------------------------------------------------------- thinking


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_fields_become_thinking(fake: FakeOpenAI, field: str) -> None:
    fake.enqueue(Step(reasoning=["Let me ", "think."], reasoning_field=field, pieces=["4"]))
    events = collect(fake.url, request())
    assert text_of(events, "thinking") == "Let me think."
    assert text_of(events) == "4"
    kinds = [e.kind for e in events]
    assert kinds.index("thinking") < kinds.index("content")


def test_think_tags_split_across_deltas_become_thinking(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(pieces=["<th", "ink>\nwhy not", "</thi", "nk>\n\nBecause."]))
    events = collect(fake.url, request())
    assert text_of(events, "thinking") == "why not"
    assert text_of(events) == "Because."


def test_each_turn_starts_outside_a_think_block(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(pieces=["<think>never closed"]), Step(pieces=["plain"]))

    async def go() -> list[list[StreamEvent]]:
        b = OpenAIBackend(fake.url, timeouts=FAST)
        try:
            return [[ev async for ev in b.stream(request())] for _ in range(2)]
        finally:
            await b.aclose()

    first, second = asyncio.run(go())
    assert text_of(first, "thinking") == "never closed"
    assert text_of(second) == "plain" and text_of(second, "thinking") == ""


# --------------------------------------------------------------------------- tool calls


def test_tool_call_fragments_are_stitched_by_index(fake: FakeOpenAI) -> None:
    fake.enqueue(
        Step(
            pieces=[],
            finish_reason="tool_calls",
            tool_fragments=[
                {
                    "index": 0,
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                },
                {
                    "index": 1,
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
                {"index": 0, "function": {"arguments": '{"city": '}},
                {"index": 0, "function": {"arguments": '"Tokyo"}'}},
            ],
        )
    )
    events = collect(fake.url, request())
    calls = [e.tool_call for e in events if e.kind == "tool_call"]
    assert calls == [
        {"id": "call_a", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}},
        {"id": "call_b", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    assert events[-1].kind == "done" and events[-1].usage is not None
    assert events[-1].usage.done_reason == "tool_calls"


def test_calls_that_reuse_an_index_are_told_apart_by_id(fake: FakeOpenAI) -> None:
    fake.enqueue(
        Step(
            pieces=[],
            tool_fragments=[
                {"index": 0, "id": "call_1", "function": {"name": "a", "arguments": "{}"}},
                {"index": 0, "id": "call_2", "function": {"name": "b", "arguments": "{}"}},
            ],
        )
    )
    calls = [e.tool_call for e in collect(fake.url, request()) if e.kind == "tool_call"]
    assert [(c["id"], c["function"]["name"]) for c in calls if c] == [
        ("call_1", "a"),
        ("call_2", "b"),
    ]


# --------------------------------------------------------------------------- framing


def test_pings_and_missing_blank_lines_are_tolerated(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(pieces=["a", "b"], pings=2, blank_lines=False))
    assert text_of(collect(fake.url, request())) == "ab"


def test_llama_cpp_timings_fill_in_durations(fake: FakeOpenAI) -> None:
    timings = {"prompt_n": 30, "prompt_ms": 12.5, "predicted_n": 2, "predicted_ms": 40.0}
    fake.enqueue(Step(pieces=["o", "k"], usage=None, timings=timings))
    usage = collect(fake.url, request(), stream_usage=False)[-1].usage
    assert usage is not None
    assert (usage.prompt_eval_count, usage.eval_count) == (30, 2)
    assert (usage.prompt_eval_duration_ms, usage.eval_duration_ms) == (12.5, 40.0)


def test_without_any_usage_the_deltas_are_counted(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(pieces=["a", "b", "c"], usage=None))
    usage = collect(fake.url, request())[-1].usage
    assert usage is not None and usage.eval_count == 3 and usage.prompt_eval_count is None


def test_a_finish_reason_without_done_still_completes(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(pieces=["fine"], send_done=False))
    events = collect(fake.url, request())
    assert text_of(events) == "fine" and events[-1].kind == "done"


def test_eof_without_done_or_finish_reason_is_a_transient_cut(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(pieces=["half"], send_done=False, finish_reason=None))
    err = fails(fake.url, request())
    assert err.transient and err.kind == "cut"


def test_a_connection_cut_mid_stream_is_transient(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(kind="cut", pieces=["a", "b", "c"], after=2))
    err = fails(fake.url, request())
    assert err.transient and err.kind == "cut"


def test_an_error_event_mid_stream_fails_the_turn(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(kind="mid_error", pieces=["a", "b"], after=1))
    err = fails(fake.url, request())
    assert err.transient and err.kind == "stream_error" and "model crashed" in str(err)


def test_an_overflow_error_event_mid_stream_is_a_context_overflow(fake: FakeOpenAI) -> None:
    error = {
        "code": 400, "message": "request (9000 tokens) exceeds the available context size "
        "(8192 tokens), try increasing it", "type": "exceed_context_size_error",
        "n_prompt_tokens": 9000, "n_ctx": 8192,
    }  # fmt: skip
    fake.enqueue(Step(kind="mid_error", after=0, error=error))
    err = fails(fake.url, request())
    assert isinstance(err, ContextOverflow) and (err.n_prompt, err.n_ctx) == (9000, 8192)


def test_pings_do_not_count_as_progress(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(kind="hang", pieces=["a", "b"], after=1, hang_pings_every=0.05))
    t0 = time.monotonic()
    err = fails(fake.url, request(), timeouts=PhaseTimeouts(2, 5, 0.5, 30))
    assert err.transient and err.kind == "stall"
    assert time.monotonic() - t0 < 4


# --------------------------------------------------------------------------- errors


def test_llama_cpp_overflow_400_is_a_context_overflow(fake: FakeOpenAI) -> None:
    body = {
        "error": {
            "code": 400,
            "message": "request (13392 tokens) exceeds the available context size (8192 tokens),"
            " try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 13392,
            "n_ctx": 8192,
        }
    }
    fake.enqueue(Step(kind="error", status=400, body=body))
    err = fails(fake.url, request())
    assert isinstance(err, ContextOverflow)
    assert (err.n_prompt, err.n_ctx) == (13392, 8192) and not err.transient


def test_llama_cpp_python_overflow_400_is_a_context_overflow(fake: FakeOpenAI) -> None:
    message = (
        "This model's maximum context length is 2048 tokens. However, you requested 3032 tokens "
        "(3031 in the messages, 1 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    error = {"message": message, "type": "invalid_request_error", "param": "messages",
             "code": "context_length_exceeded"}  # fmt: skip
    fake.enqueue(Step(kind="error", status=400, body={"error": error}))
    err = fails(fake.url, request())
    assert isinstance(err, ContextOverflow) and (err.n_prompt, err.n_ctx) == (3031, 2048)


def test_an_empty_stream_is_diagnosed_as_the_overflow_it_hides(fake: FakeOpenAI) -> None:
    error = {"message": "This model's maximum context length is 2048 tokens. However, you "
             "requested 5001 tokens (5000 in the messages, 1 in the completion).",
             "type": "invalid_request_error", "code": "context_length_exceeded"}  # fmt: skip
    fake.enqueue(Step(kind="empty"), Step(kind="error", status=400, body={"error": error}))
    err = fails(fake.url, request())
    assert isinstance(err, ContextOverflow) and err.n_prompt == 5000
    probe = fake.chat_requests()[1]
    assert probe["stream"] is False and probe["max_tokens"] == 1


def test_an_empty_stream_without_a_diagnosis_is_a_transient_cut(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(kind="empty"), Step(pieces=["x"]))
    err = fails(fake.url, request())
    assert err.transient and err.kind == "cut"


def test_429_with_retry_after_is_transient(fake: FakeOpenAI) -> None:
    fake.enqueue(Step(kind="error", status=429, headers={"Retry-After": "7"}))
    err = fails(fake.url, request())
    assert err.transient and err.retry_after == 7 and err.status_code == 429


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_transient(fake: FakeOpenAI, status: int) -> None:
    fake.enqueue(Step(kind="error", status=status))
    err = fails(fake.url, request())
    assert err.transient and err.status_code == status


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_permanent_and_name_the_key(fake: FakeOpenAI, status: int) -> None:
    fake.enqueue(Step(kind="error", status=status, body={"error": {"message": "bad key"}}))
    err = fails(fake.url, request())
    assert not err.transient and err.kind == "auth" and "OPENAI_API_KEY" in str(err)


def test_an_unknown_model_is_permanent(fake: FakeOpenAI) -> None:
    body = {"error": {"message": "model 'nope' not found", "type": "not_found_error"}}
    fake.enqueue(Step(kind="error", status=404, body=body))
    err = fails(fake.url, request(model="nope"))
    assert not err.transient and err.kind == "model_not_found" and "nope" in str(err)


def test_a_wrong_path_404_points_at_the_base_url(fake: FakeOpenAI) -> None:
    err = fails(f"{fake.url}/wrong", request(), where="openai.base_url")
    assert not err.transient and "OPENAI_BASE_URL" in str(err)


def test_llama_cpp_python_validation_500_is_permanent(fake: FakeOpenAI) -> None:
    body = {
        "error": {"message": "1 validation error: temperature", "type": "internal_server_error"}
    }
    fake.enqueue(Step(kind="error", status=500, body=body))
    err = fails(fake.url, request())
    assert not err.transient and err.kind == "bad_request"


def test_an_unreachable_server_is_transient_and_says_so() -> None:
    port = realpeers.free_port()
    err = fails(f"http://127.0.0.1:{port}", request())
    assert err.transient and err.kind == "unreachable"


# --------------------------------------------------------------------------- models


def test_capabilities_take_the_context_from_the_model_list(fake: FakeOpenAI) -> None:
    fake.models = [{"id": "qwen3-8b", "meta": {"n_ctx_train": 40960}}, {"id": "other"}]

    async def go() -> Any:
        b = OpenAIBackend(
            fake.url, timeouts=FAST, overrides={"other": CapabilityOverride(tools=True)}
        )
        try:
            return (
                await b.capabilities("qwen3-8b"),
                await b.capabilities("other"),
                await b.check("missing"),
            )
        finally:
            await b.aclose()

    qwen, other, checks = asyncio.run(go())
    assert qwen.thinking and qwen.context_length == 40960 and qwen.source == "family table"
    assert other.tools and other.source == "config"
    assert checks[0].ok and "qwen3-8b, other" in checks[0].detail
    assert not checks[1].ok and checks[1].name == "model"


# --------------------------------------------------------------------------- real llama.cpp


@pytest.fixture(scope="session")
def llama() -> realpeers.LlamaServer:
    return realpeers.shared_llama_server()


@pytest.mark.real
def test_real_llama_cpp_streams_a_reply_with_usage(llama: realpeers.LlamaServer) -> None:
    req = ChatRequest(
        "smollm2",
        (ChatMessage("user", "Name a colour."),),
        options={"temperature": 0, "num_predict": 8},
    )
    events = collect(llama.url, req, timeouts=PhaseTimeouts(5, 60, 30, 120))
    assert text_of(events).strip()
    usage = events[-1].usage
    assert usage is not None and usage.done_reason == "length"
    assert usage.eval_count == 8  # llama-server's usage chunk, not a count of deltas
    assert usage.prompt_eval_count is not None and usage.prompt_eval_count > 5
    assert usage.eval_duration_ms and usage.prompt_eval_duration_ms  # its timings
    assert usage.first_token_ms is not None and usage.wall_ms is not None


@pytest.mark.real
def test_real_llama_cpp_back_to_back_turns_all_go_through(llama: realpeers.LlamaServer) -> None:
    """llama-server closes a stream's connection after its last chunk; the next turn, sent
    at once on the pooled connection, used to fail half the time (aiohttp learns of the close
    a loop pass later). Twelve turns in a row, no pause: every one gets its reply."""
    req = ChatRequest(
        "smollm2",
        (ChatMessage("user", "Tell me a story."),),
        options={"temperature": 0, "num_predict": 12},
    )

    async def go() -> list[str]:
        b = OpenAIBackend(llama.url, timeouts=PhaseTimeouts(5, 60, 30, 120))
        outcomes: list[str] = []
        try:
            for _ in range(12):
                try:
                    events = [e async for e in b.stream(req)]
                    outcomes.append(events[-1].kind)
                except BackendError as exc:
                    outcomes.append(f"{exc.kind}: {exc}")
        finally:
            await b.aclose()
        return outcomes

    assert asyncio.run(go()) == ["done"] * 12


@pytest.mark.real
def test_real_llama_cpp_overflow_is_a_context_overflow(llama: realpeers.LlamaServer) -> None:
    req = ChatRequest("smollm2", (ChatMessage("user", "word " * 9000),))
    err = fails(llama.url, req, timeouts=PhaseTimeouts(5, 60, 30, 120))
    assert isinstance(err, ContextOverflow)
    assert err.n_ctx == llama.n_ctx and err.n_prompt is not None and err.n_prompt > llama.n_ctx


@pytest.mark.real
def test_real_llama_cpp_check_lists_its_model(llama: realpeers.LlamaServer) -> None:
    async def go() -> Any:
        b = OpenAIBackend(llama.url, timeouts=FAST)
        try:
            return await b.check("smollm2")
        finally:
            await b.aclose()

    checks = asyncio.run(go())
    assert all(c.ok for c in checks) and "smollm2" in checks[0].detail


# --------------------------------------------------------------------------- the daemon path


def test_through_the_pipeline_a_fallback_reply_is_logged_with_its_note_and_thinking(
    fake: FakeOpenAI, home: Home, make_settings: Callable[..., Settings]
) -> None:
    """Ollama is down; the turn goes to the OpenAI-compatible server, and the log says so."""
    down = f"http://127.0.0.1:{realpeers.free_port()}"
    settings = make_settings(
        fallback=["ollama", "openai"],
        ollama={"host": down},
        openai={"base_url": fake.url},
    )
    conv = new_conversation(
        home, "fallback", template=load_template(home, "default"), model="m", backend="ollama"
    )
    drop_message(conv, "Why?")
    fake.enqueue(Step(reasoning=["pondering"], pieces=["Because."]))
    run_burst(Runtime(settings=settings, home=home))
    log = conv.log.read_text()
    assert f"=== NOTE: ollama unreachable (cannot reach {down}" in log
    assert "this reply comes from openai ===" in log
    assert "=== THINKING ===\npondering\n=== END THINKING ===" in log
    (_agent, model) = parse(conv.log.read_bytes()).blocks
    assert model.kind is BlockKind.MODEL and model.text.strip() == "Because."
    assert model.thinking.strip() == "pondering"
