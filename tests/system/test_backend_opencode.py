"""The OpenCode backend: a scripted ``opencode serve`` for the protocol, the real one for proof."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import structlog

from contemplation.backends.opencode import (
    OPENCODE_TOOLS,
    OpenCodeBackend,
    OpenCodeTimeouts,
    digest,
    flatten,
    new_messages,
)
from contemplation.engine.pipeline import Runtime, process
from contemplation.engine.tracking import Tracked
from contemplation.errors import BackendError, ContextOverflow
from contemplation.models import BackendSession, ChatMessage, ChatRequest, State, StreamEvent
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import archive, drop_message, new_conversation
from tests import realpeers
from tests.conftest import run_burst
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


def req(
    *texts: str,
    conv: str = "conv_1",
    model: str = "local/smollm2",
    session: BackendSession | None = None,
) -> ChatRequest:
    """A request whose history alternates user/assistant, starting and ending with a user;
    ``session`` is what state.json recorded (the turn passes it on)."""
    msgs = [SYSTEM] + [
        ChatMessage("user" if i % 2 == 0 else "assistant", t) for i, t in enumerate(texts)
    ]
    return ChatRequest(model, tuple(msgs), conversation_id=conv, session=session)


def reported(events: list[StreamEvent]) -> BackendSession:
    """The session a turn reported (the turn records it in state.json)."""
    (session,) = [e.session for e in events if e.kind == "session" and e.session is not None]
    return session


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
    known = BackendSession(
        backend="opencode",
        id="ses_1",
        messages=2,
        digest=digest([("user", "a"), ("assistant", "b")]),
    )
    hist = [ChatMessage("user", "a"), ChatMessage("assistant", "b (as logged)"),
            ChatMessage("user", "c"), ChatMessage("user", "d")]  # fmt: skip
    assert [m.content for m in new_messages(known, hist)] == ["c", "d"]
    edited = [ChatMessage("user", "A"), *hist[1:]]
    assert new_messages(known, edited) == []
    assert new_messages(known, hist[:2]) == []
    # a reply where the session holds a user message: not the same history
    shifted = [ChatMessage("assistant", "a"), ChatMessage("assistant", "b"), *hist[2:]]
    assert new_messages(known, shifted) == []
    assert new_messages(known.model_copy(update={"messages": 0}), hist) == []


def test_the_digest_covers_roles_and_user_text_but_not_reply_text() -> None:
    base = digest([("user", "a"), ("assistant", "b")])
    assert digest([("user", "a"), ("assistant", "b, laid out differently")]) == base
    assert digest([("user", "a!"), ("assistant", "b")]) != base
    assert digest([("user", "a"), ("user", "b")]) != base
    assert digest([("user", "a")]) != base


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
    # what the turn records in state.json: the session, what it holds, its last message
    held = reported(events)
    (_, reply) = fake.history[sid]
    assert (held.backend, held.id, held.messages) == ("opencode", sid, 2)
    assert held.last_message == reply["info"]["id"] and held.last_message.startswith("msg_")
    assert held.digest == digest([("user", "Capital of France?"), ("assistant", "Paris.")])
    assert [e.kind for e in events][-2:] == ["session", "done"]


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
    (events,), _ = run_turns(fake.url, req("hi", conv=""))
    assert len(fake.calls("DELETE")) == 1 and not fake.sessions
    assert "session" not in [e.kind for e in events]  # nothing to record


# --------------------------------------------------------------------------- after a restart


def first_turn(url: str, *texts: str) -> tuple[list[StreamEvent], BackendSession]:
    """One turn by a backend that then closes (the daemon stops): what it reported."""
    (events,), _ = run_turns(url, req(*texts))
    return events, reported(events)


def test_closing_the_backend_keeps_the_sessions(fake: FakeOpenCode) -> None:
    run_turns(fake.url, req("a", conv="c1"), req("b", conv="c2"))
    assert len(fake.sessions) == 2 and not fake.calls("DELETE")


def test_a_restarted_backend_goes_on_in_the_recorded_session(fake: FakeOpenCode) -> None:
    fake.enqueue(Step(text="Paris."), Step(text="Rome."))
    _, held = first_turn(fake.url, "Capital of France?")
    second = req("Capital of France?", "Paris.", "And Italy?", session=held)
    (events,), sid = run_turns(fake.url, second)  # a new backend: nothing in memory
    assert sid == held.id and content(events) == "Rome."
    assert len(fake.calls("POST", "/session")) == 1  # no new session
    (check,) = fake.calls("GET", "/message?limit=1")  # the server confirms it as left
    assert check["_path"].startswith(f"/session/{held.id}/")
    last = fake.calls("POST", "/message")[-1]
    assert last["_path"] == f"/session/{held.id}/message"
    assert last["body"]["parts"] == [{"type": "text", "text": "And Italy?"}]
    now = reported(events)
    assert (now.id, now.messages) == (held.id, 4) and now.last_message != held.last_message
    assert now.last_message == fake.history[held.id][-1]["info"]["id"]


def test_a_recorded_session_gone_after_a_restart_gets_a_new_one_with_the_history(
    fake: FakeOpenCode,
) -> None:
    _, held = first_turn(fake.url, "France?")
    with fake.lock:
        del fake.sessions[held.id]  # deleted on the server while the daemon was down
    (events,), sid = run_turns(fake.url, req("France?", "Echo: France?", "Italy?", session=held))
    assert sid is not None and sid != held.id
    (check,) = fake.calls("GET", "/message?limit=1")
    assert check["_path"].startswith(f"/session/{held.id}/")
    assert len(fake.calls("POST", "/session")) == 2
    text = fake.calls("POST", "/message")[-1]["body"]["parts"][0]["text"]
    assert "[user]\nFrance?" in text and text.endswith("[the new message]\nItaly?")
    now = reported(events)
    assert (now.id, now.messages) == (sid, 4)


def test_a_recorded_session_that_went_on_without_us_is_replaced(fake: FakeOpenCode) -> None:
    """The daemon stopped after OpenCode answered but before it recorded the reply: the
    session holds a turn the log does not; the redone turn must not be sent into it again."""
    _, held = first_turn(fake.url, "France?")
    with httpx.Client(base_url=fake.url) as c:  # the turn the old daemon never recorded
        c.post(f"/session/{held.id}/message", json={"parts": [{"type": "text", "text": "Italy?"}]})
    (events,), sid = run_turns(fake.url, req("France?", "Echo: France?", "Italy?", session=held))
    assert sid != held.id and held.id not in fake.sessions  # deleted, not reused
    text = fake.calls("POST", "/message")[-1]["body"]["parts"][0]["text"]
    assert text.startswith("This conversation started earlier")
    assert reported(events).id == sid


def test_a_recorded_session_whose_history_no_longer_matches_is_replaced(
    fake: FakeOpenCode,
) -> None:
    _, held = first_turn(fake.url, "Capital of France?")
    edited = req("Capital of Spain?", "Echo: Capital of France?", "And Italy?", session=held)
    (events,), sid = run_turns(fake.url, edited)
    assert sid != held.id and held.id not in fake.sessions
    assert [c["_path"] for c in fake.calls("DELETE")] == [f"/session/{held.id}"]
    text = fake.calls("POST", "/message")[-1]["body"]["parts"][0]["text"]
    assert "Capital of Spain?" in text and text.endswith("And Italy?")
    assert reported(events).id == sid


def test_a_session_recorded_by_another_backend_is_not_resumed(fake: FakeOpenCode) -> None:
    other = BackendSession(backend="elsewhere", id="ses_0001fake", messages=2)
    (events,), sid = run_turns(fake.url, req("a", "b", "c", session=other))
    assert not fake.calls("GET", "/message?limit=1") and reported(events).id == sid


# --------------------------------------------------------------------------- through the daemon


def oc_runtime(make_settings: Callable[..., Settings], fake: FakeOpenCode) -> Runtime:
    """A daemon's runtime; a new one is a restarted daemon (its backends know nothing)."""
    s = make_settings(opencode={"url": fake.url})
    return Runtime(settings=s, home=Home(s.home))


def oc_conv(home: Home) -> Conv:
    return new_conversation(
        home, "cities", template=load_template(home, "default"), model="local/smollm2",
        backend="opencode",
    )  # fmt: skip


def state(conv: Conv) -> State:
    st = read_state(conv)
    assert st is not None
    return st


def archive_and_forget(home: Home, conv: Conv, rt: Runtime) -> None:
    """``contemplation archive``, then the daemon's next look at the folder that went."""
    archive(home, conv)

    async def go() -> None:
        try:
            assert await process(conv, rt, Tracked()) is None
        finally:
            await rt.aclose()

    asyncio.run(go())


def test_a_restarted_daemon_goes_on_in_the_session_state_json_names(
    home: Home, fake: FakeOpenCode, make_settings: Callable[..., Settings]
) -> None:
    conv = oc_conv(home)
    drop_message(conv, "Capital of France?")
    run_burst(oc_runtime(make_settings, fake))  # one turn, then the daemon stops
    held = state(conv).backend_session
    assert held is not None and held.backend == "opencode" and held.messages == 2
    assert held.id in fake.sessions  # stopping kept it
    assert held.last_message == fake.history[held.id][-1]["info"]["id"]
    drop_message(conv, "And Italy?")
    run_burst(oc_runtime(make_settings, fake))  # a new daemon
    st = state(conv)
    assert st.turns == 2 and st.backend_session is not None
    assert (st.backend_session.id, st.backend_session.messages) == (held.id, 4)
    assert len(fake.calls("POST", "/session")) == 1
    second = fake.calls("POST", "/message")[-1]
    assert second["_path"] == f"/session/{held.id}/message"
    assert second["body"]["parts"] == [{"type": "text", "text": "And Italy?"}]
    archive_and_forget(home, conv, oc_runtime(make_settings, fake))  # a third daemon
    assert [c["_path"] for c in fake.calls("DELETE")] == [f"/session/{held.id}"]
    assert not fake.sessions


def test_a_session_gone_while_the_daemon_was_down_is_replaced_and_recorded(
    home: Home, fake: FakeOpenCode, make_settings: Callable[..., Settings]
) -> None:
    conv = oc_conv(home)
    drop_message(conv, "Capital of France?")
    run_burst(oc_runtime(make_settings, fake))
    old = state(conv).backend_session
    assert old is not None
    with fake.lock:
        del fake.sessions[old.id]
    drop_message(conv, "And Italy?")
    run_burst(oc_runtime(make_settings, fake))
    new = state(conv).backend_session
    assert new is not None and new.id != old.id and new.id in fake.sessions
    assert new.messages == 4 and state(conv).turns == 2
    text = fake.calls("POST", "/message")[-1]["body"]["parts"][0]["text"]
    assert "[user]\nCapital of France?" in text and text.endswith("And Italy?")


def test_an_archive_whose_delete_fails_is_logged_and_the_daemon_goes_on(
    home: Home, fake: FakeOpenCode, make_settings: Callable[..., Settings]
) -> None:
    conv = oc_conv(home)
    drop_message(conv, "hi")
    run_burst(oc_runtime(make_settings, fake))
    held = state(conv).backend_session
    assert held is not None
    fake.delete_status = 500
    with structlog.testing.capture_logs() as logs:
        archive_and_forget(home, conv, oc_runtime(make_settings, fake))
    assert [(e["event"], e["session"]) for e in logs if "session" in e] == [
        ("opencode_delete_failed", held.id)
    ]
    assert held.id in fake.sessions


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


def test_forget_after_a_restart_deletes_the_session_state_json_names(
    fake: FakeOpenCode,
) -> None:
    _, held = first_turn(fake.url, "hi")

    async def go() -> None:
        b = backend(fake.url)  # knows nothing of conv_1 but what it is told
        try:
            await b.forget("conv_1", held)
        finally:
            await b.aclose()

    asyncio.run(go())
    assert [c["_path"] for c in fake.calls("DELETE")] == [f"/session/{held.id}"]
    assert not fake.sessions


def test_a_failed_delete_is_logged_and_never_raised(fake: FakeOpenCode) -> None:
    _, held = first_turn(fake.url, "hi")
    fake.delete_status = 500
    down = f"http://127.0.0.1:{realpeers.free_port()}"

    async def go() -> None:
        for url in (fake.url, down):
            b = backend(url)
            try:
                await b.forget("conv_1", held)
            finally:
                await b.aclose()

    with structlog.testing.capture_logs() as logs:
        asyncio.run(go())
    failed = [e for e in logs if e["event"] == "opencode_delete_failed"]
    assert [(e["session"], e.get("status")) for e in failed] == [(held.id, 500), (held.id, None)]
    assert failed[1]["error"].startswith(f"cannot reach {down}")
    assert held.id in fake.sessions  # still there: it was not deleted


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
    opencode: realpeers.OpenCodeServer,
) -> None:
    """The module's server is the one killed and restarted (on its port, in its home): a
    server of its own cost another OpenCode start (~10 s). The tests after this one get the
    restarted server, which is what this shows answers; each makes sessions of its own."""
    server = opencode

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
    server.start()  # the fixture stops it at the module's end, as before the kill
    (events,), _ = run_turns(server.url, req("Say hello.", conv="k"), timeouts=REAL_TIMEOUTS)
    assert content(events).strip() and events[-1].kind == "done"


@pytest.mark.real
def test_real_opencode_a_restarted_backend_goes_on_in_the_recorded_session(
    opencode: realpeers.OpenCodeServer,
) -> None:
    """Two backends, as two daemon lives: the second is told only what state.json recorded,
    and the real server confirms the session is as it was left (its last message)."""

    async def go() -> tuple[BackendSession, list[StreamEvent], list[dict[str, Any]]]:
        b1 = backend(opencode.url, timeouts=REAL_TIMEOUTS)
        try:
            first = await turn(b1, req("Name a colour.", conv="life"))
        finally:
            await b1.aclose()
        held = reported(first)
        b2 = backend(opencode.url, timeouts=REAL_TIMEOUTS)
        try:
            second = await turn(
                b2, req("Name a colour.", content(first), "Another one?", conv="life", session=held)
            )
            await b2.forget("life", reported(second))
        finally:
            await b2.aclose()
        async with httpx.AsyncClient() as c:
            gone = await c.get(f"{opencode.url}/session/{held.id}/message", timeout=10)
        return held, second, [{"status": gone.status_code}]

    held, second, (gone,) = asyncio.run(go())
    now = reported(second)
    assert held.id.startswith("ses") and held.last_message.startswith("msg")
    assert now.id == held.id and now.messages == 4  # the same session, two turns in it
    assert now.last_message and now.last_message != held.last_message
    assert content(second).strip() and second[-1].kind == "done"
    assert gone["status"] == 404  # forget deleted it
