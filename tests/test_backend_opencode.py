"""The OpenCode backend: a scripted ``opencode serve`` for the protocol, the real one for proof."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from contemplation.backends.opencode import OpenCodeBackend, flatten, new_messages
from contemplation.errors import BackendError, ContextOverflow
from contemplation.models import ChatMessage, ChatRequest, StreamEvent
from contemplation.settings import OPENCODE_TOOLS, OpenCodeTimeouts
from tests import realpeers
from tests.fakes.opencode_server import FakeOpenCode, Step

SYSTEM = ChatMessage("system", "Answer in one short sentence.")
TOOLS_OFF = dict.fromkeys(OPENCODE_TOOLS, False)


@pytest.fixture
def fake() -> Iterator[FakeOpenCode]:
    server = FakeOpenCode().start()
    yield server
    server.stop()


def backend(url: str, **kw: Any) -> OpenCodeBackend:
    kw.setdefault("tools", TOOLS_OFF)
    return OpenCodeBackend(url, **kw)


def req(*texts: str, conv: str = "conv_1", model: str = "local/smollm2") -> ChatRequest:
    """A request whose history alternates user/assistant, starting and ending with a user."""
    msgs = [SYSTEM] + [
        ChatMessage("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)
    ]
    return ChatRequest(model, tuple(msgs), conversation_id=conv)


async def turn(b: OpenCodeBackend, request: ChatRequest) -> list[StreamEvent]:
    return [ev async for ev in b.stream(request)]


def content(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if e.kind == "content")


def run_turns(url: str, *requests: ChatRequest, **kw: Any) -> tuple[list[list[StreamEvent]], Any]:
    async def go() -> tuple[list[list[StreamEvent]], Any]:
        b = backend(url, **kw)
        out: list[list[StreamEvent]] = []
        try:
            for r in requests:
                out.append(await turn(b, r))
            return out, b.session_id(requests[-1].conversation_id)
        finally:
            await b.aclose()

    return asyncio.run(go())


def fails(url: str, *requests: ChatRequest, **kw: Any) -> BackendError:
    with pytest.raises(BackendError) as info:
        run_turns(url, *requests, **kw)
    return info.value


# --------------------------------------------------------------------------- pure parts


def test_only_messages_after_the_known_history_are_new() -> None:
    known = [("user", "a"), ("assistant", "b")]
    hist = [ChatMessage("user", "a"), ChatMessage("assistant", "b (as logged)"),
            ChatMessage("user", "c"), ChatMessage("user", "d")]  # fmt: skip
    assert [m.content for m in new_messages(known, hist)] == ["c", "d"]
    edited = [ChatMessage("user", "A"), *hist[1:]]
    assert new_messages(known, edited) == []
    assert new_messages(known, hist[:2]) == []


def test_a_flattened_history_ends_with_the_new_message() -> None:
    hist = [ChatMessage("user", "first"), ChatMessage("assistant", "reply"),
            ChatMessage("user", "second")]  # fmt: skip
    flat = flatten(hist)
    assert "[user]\nfirst" in flat and "[assistant]\nreply" in flat
    assert flat.endswith("[the new message]\nsecond")
    assert flatten(hist[:1]) == "first"


# --------------------------------------------------------------------------- turns


def test_a_first_turn_creates_a_session_and_sends_the_prompt(fake: FakeOpenCode) -> None:
    fake.enqueue(Step(text="Paris.", reasoning="The capital..."))
    (events,), sid = run_turns(fake.url, req("Capital of France?"))
    assert content(events) == "Paris."
    assert [e.text for e in events if e.kind == "thinking"] == ["The capital..."]
    usage = events[-1].usage
    assert usage is not None and (usage.prompt_eval_count, usage.eval_count) == (10, 3)
    assert usage.done_reason == "stop"
    (create,) = fake.calls("POST", "/session")
    assert create["body"]["title"] == "contemplation conv_1"
    (prompt,) = fake.calls("POST", "/message")
    body = prompt["body"]
    assert body["parts"] == [{"type": "text", "text": "Capital of France?"}]
    assert body["model"] == {"providerID": "local", "modelID": "smollm2"}
    assert body["tools"] == TOOLS_OFF and body["system"] == SYSTEM.content
    assert prompt["_path"] == f"/session/{sid}/message"


def test_the_next_turn_reuses_the_session_and_sends_only_the_new_text(
    fake: FakeOpenCode,
) -> None:
    fake.enqueue(Step(text="Paris."), Step(text="Rome."))
    first = req("Capital of France?")
    second = req("Capital of France?", "Paris.", "And Italy?")
    (_, events), sid = run_turns(fake.url, first, second)
    assert content(events) == "Rome."
    assert len(fake.calls("POST", "/session")) == 1
    prompts = fake.calls("POST", "/message")
    assert [p["_path"] for p in prompts] == [f"/session/{sid}/message"] * 2
    assert prompts[1]["body"]["parts"][0]["text"] == "And Italy?"


def test_a_diverged_history_gets_a_new_session_with_everything(fake: FakeOpenCode) -> None:
    first = req("Capital of France?")
    edited = req("Capital of Spain?", "Echo: Capital of France?", "And Italy?")
    run_turns(fake.url, first, edited)
    assert len(fake.calls("POST", "/session")) == 2
    assert len(fake.calls("DELETE")) >= 1  # the stale session is deleted
    text = fake.calls("POST", "/message")[1]["body"]["parts"][0]["text"]
    assert "Capital of Spain?" in text and text.endswith("And Italy?")


def test_a_session_lost_on_the_server_is_recreated_once_with_the_history(
    fake: FakeOpenCode,
) -> None:
    fake.enqueue(Step(text="Paris."), Step(kind="forget_session"), Step(text="Rome."))
    (_, events), sid = run_turns(fake.url, req("France?"), req("France?", "Paris.", "Italy?"))
    assert content(events) == "Rome."
    assert len(fake.calls("POST", "/session")) == 2
    last = fake.calls("POST", "/message")[-1]
    assert last["_path"] == f"/session/{sid}/message"
    assert "[user]\nFrance?" in last["body"]["parts"][0]["text"]


def test_tool_parts_are_noted(fake: FakeOpenCode) -> None:
    fake.enqueue(Step(text="done", tools=["read"]))
    (events,), _ = run_turns(fake.url, req("x"))
    assert [e.text for e in events if e.kind == "note"] == [
        "OpenCode ran its tool read (completed)"
    ]


def test_without_a_conversation_id_the_session_is_not_kept(fake: FakeOpenCode) -> None:
    run_turns(fake.url, req("hi", conv=""))
    assert len(fake.calls("DELETE")) == 1 and not fake.sessions


# --------------------------------------------------------------------------- errors


def test_a_model_name_without_provider_fails_before_any_session(fake: FakeOpenCode) -> None:
    err = fails(fake.url, req("hi", model="smollm2"))
    assert not err.transient and "provider/model" in str(err)
    assert not fake.calls("POST", "/session")


def test_400_bad_request_is_permanent(fake: FakeOpenCode) -> None:
    body = {"name": "BadRequest", "data": {"message": "Expected boolean", "kind": "Payload"}}
    fake.enqueue(Step(kind="http_error", status=400, body=body))
    err = fails(fake.url, req("hi"))
    assert not err.transient and err.status_code == 400 and "Expected boolean" in str(err)


def test_500_unknown_error_is_transient_for_a_known_model(fake: FakeOpenCode) -> None:
    fake.enqueue(Step(kind="http_error", status=500))
    err = fails(fake.url, req("hi"))
    assert err.transient and err.status_code == 500


def test_500_for_a_model_opencode_does_not_know_is_permanent(fake: FakeOpenCode) -> None:
    fake.enqueue(Step(kind="http_error", status=500))
    err = fails(fake.url, req("hi", model="local/nosuch"))
    assert not err.transient and err.kind == "model_not_found"


def test_an_upstream_api_error_is_transient_and_the_session_is_dropped(
    fake: FakeOpenCode,
) -> None:
    error = {"name": "APIError", "data": {"message": "Internal Server Error", "statusCode": 500,
                                          "isRetryable": True}}  # fmt: skip
    fake.enqueue(Step(kind="info_error", error=error))
    err = fails(fake.url, req("hi"))
    assert err.transient and err.kind == "upstream" and "Internal Server Error" in str(err)
    assert not fake.sessions  # a half-done session is never reused


@pytest.mark.parametrize(
    ("error", "kind", "transient"),
    [
        ({"name": "MessageAbortedError", "data": {"message": "Aborted"}}, "cancelled", False),
        ({"name": "ProviderAuthError", "data": {"providerID": "x", "message": "no key"}}, "auth", False),
        ({"name": "APIError", "data": {"message": "bad", "statusCode": 400, "isRetryable": False}},
         "upstream", False),
        ({"name": "UnknownError", "data": {"message": "?"}}, "upstream", True),
    ],
)  # fmt: skip
def test_info_errors_map_to_kinds(
    fake: FakeOpenCode, error: dict[str, Any], kind: str, transient: bool
) -> None:
    fake.enqueue(Step(kind="info_error", error=error))
    err = fails(fake.url, req("hi"))
    assert (err.kind, err.transient) == (kind, transient)


def test_an_overflow_reported_by_opencode_is_a_context_overflow(fake: FakeOpenCode) -> None:
    error = {"name": "ContextOverflowError", "data": {"message": "prompt too long"}}
    fake.enqueue(Step(kind="info_error", error=error))
    assert isinstance(fails(fake.url, req("hi")), ContextOverflow)


def test_basic_auth_is_sent_and_its_absence_is_explained() -> None:
    server = FakeOpenCode(password="s3cret").start()  # noqa: S106 - a test server
    try:
        (events,), _ = run_turns(server.url, req("hi"), auth=("opencode", "s3cret"))
        assert content(events) == "Echo: hi"
        err = fails(server.url, req("hi"))
        assert not err.transient and err.kind == "auth"
        assert "OPENCODE_SERVER_PASSWORD" in str(err)
    finally:
        server.stop()


def test_an_unreachable_server_is_transient() -> None:
    err = fails(f"http://127.0.0.1:{realpeers.free_port()}", req("hi"))
    assert err.transient and err.kind == "unreachable"


def test_a_prompt_past_its_timeout_is_aborted(fake: FakeOpenCode) -> None:
    fake.enqueue(Step(kind="hang"))
    err = fails(fake.url, req("hi"), timeouts=OpenCodeTimeouts(prompt=0.5))
    assert err.transient and err.kind == "timeout"
    assert len(fake.calls("POST", "/abort")) == 1


def test_cancelling_a_turn_aborts_it_on_the_server(fake: FakeOpenCode) -> None:
    fake.enqueue(Step(kind="hang"))

    async def go() -> None:
        b = backend(fake.url)
        task = asyncio.create_task(turn(b, req("hi")))
        deadline = time.monotonic() + 5
        while not fake.busy:
            assert time.monotonic() < deadline, "the prompt never reached the server"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await b.aclose()

    asyncio.run(go())
    assert len(fake.calls("POST", "/abort")) == 1
    assert not fake.sessions  # the aborted session is deleted, never reused


# --------------------------------------------------------------------------- lifecycle


def test_forget_deletes_the_session(fake: FakeOpenCode) -> None:
    async def go() -> tuple[str | None, int]:
        b = backend(fake.url)
        try:
            await turn(b, req("hi"))
            sid = b.session_id("conv_1")
            await b.forget("conv_1")
            async with httpx.AsyncClient() as c:
                status = (await c.get(f"{fake.url}/session/{sid}")).status_code
            return b.session_id("conv_1"), status
        finally:
            await b.aclose()

    assert asyncio.run(go()) == (None, 404)


def test_aclose_deletes_every_session(fake: FakeOpenCode) -> None:
    run_turns(fake.url, req("a", conv="c1"), req("b", conv="c2"))
    assert not fake.sessions and len(fake.calls("DELETE")) == 2


def test_check_and_capabilities_come_from_the_server(fake: FakeOpenCode) -> None:
    async def go() -> Any:
        b = backend(fake.url)
        try:
            return (
                await b.check("local/smollm2"),
                await b.check("local/other"),
                await b.capabilities("local/smollm2"),
            )
        finally:
            await b.aclose()

    good, bad, caps = asyncio.run(go())
    assert [c.ok for c in good] == [True, True] and "1.18.33" in good[0].detail
    assert [c.ok for c in bad] == [True, False]
    assert caps.context_length == 8192


# --------------------------------------------------------------------------- real OpenCode


@pytest.fixture(scope="module")
def llama() -> realpeers.LlamaServer:
    return realpeers.shared_llama_server()


@pytest.fixture(scope="module")
def opencode(llama: realpeers.LlamaServer) -> Iterator[realpeers.OpenCodeServer]:
    server = realpeers.OpenCodeServer(llama.url).start()
    yield server
    server.stop()


REAL_TIMEOUTS = OpenCodeTimeouts(prompt=240)


@pytest.mark.real
def test_real_opencode_two_turns_share_a_session_and_forget_deletes_it(
    opencode: realpeers.OpenCodeServer,
) -> None:
    async def go() -> tuple[list[list[StreamEvent]], str | None, str | None, int]:
        b = backend(opencode.url, timeouts=REAL_TIMEOUTS)
        try:
            first = await turn(b, req("What is the capital of France?", conv="real"))
            sid = b.session_id("real")
            second = await turn(
                b, req("What is the capital of France?", content(first), "And Italy?", conv="real")
            )
            again = b.session_id("real")
            await b.forget("real")
            async with httpx.AsyncClient() as c:
                status = (await c.get(f"{opencode.url}/session/{sid}", timeout=10)).status_code
            return [first, second], sid, again, status
        finally:
            await b.aclose()

    (first, second), sid, again, status = asyncio.run(go())
    assert content(first).strip() and content(second).strip()
    assert first[-1].kind == second[-1].kind == "done"
    assert sid is not None and sid.startswith("ses") and again == sid
    assert status == 404


@pytest.mark.real
def test_real_opencode_killed_mid_turn_is_transient_and_a_restart_answers(
    llama: realpeers.LlamaServer,
) -> None:
    server = realpeers.OpenCodeServer(llama.url).start()
    try:

        async def killed() -> BackendError:
            b = backend(server.url, timeouts=REAL_TIMEOUTS)
            task = asyncio.create_task(turn(b, req("Tell me about cats.", conv="k")))
            async with httpx.AsyncClient(base_url=server.url, timeout=5) as c:
                deadline = time.monotonic() + 60
                while True:  # until OpenCode is working on our turn
                    assert time.monotonic() < deadline, "the turn never started"
                    assert not task.done(), "the turn ended before the kill"
                    sid = b.session_id("k")
                    if sid and sid in (await c.get("/session/status")).json():
                        break
                    await asyncio.sleep(0.05)
            server.kill()
            try:
                with pytest.raises(BackendError) as info:
                    await task
            finally:
                await b.aclose()
            return info.value

        err = asyncio.run(killed())
        assert err.transient, err
        server.start()
        (events,), _ = run_turns(server.url, req("Say hello.", conv="k"), timeouts=REAL_TIMEOUTS)
        assert content(events).strip() and events[-1].kind == "done"
    finally:
        server.stop()
