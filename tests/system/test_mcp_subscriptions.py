"""Resource subscriptions of ``contemplation mcp``: the real SDK client against the real server,
in both protocol eras — ``resources/subscribe`` (2025-11-25, what Claude Code and Claude
Desktop speak) and ``subscriptions/listen`` (2026-07-28) — in process, over stdio with a real
daemon answering, and over streamable HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from contemplation import settings as settings_mod
from contemplation.faces.mcp import server as mcp_server
from contemplation.faces.mcp.calls import Limits
from contemplation.models import Status
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import DaemonLock, drop_message, new_conversation, open_writer
from tests import mcp_http
from tests.conftest import ROOT, DaemonProc, base_env
from tests.fakes.ollama_server import FakeOllama, Step

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

UPDATED = "notifications/resources/updated"


def settings_for(home: Home) -> Settings:
    return settings_mod.load(home=home.root, env={}, config=None)


def a_conversation(home: Home, topic: str = "subs") -> Conv:
    conv = new_conversation(
        home, topic, template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "Plan the migration.", msg_id="m1")
    return conv


def uris(conv: Conv) -> tuple[str, str]:
    return f"conversation://{conv.id}/log", f"conversation://{conv.id}/status"


def model_replies(conv: Conv, text: str, msg_id: str) -> None:
    """The model's reply, written the way the daemon writes it."""
    with open_writer(conv) as w:
        r = w.reply("OLLAMA", "CLAUDE", msg_id)
        r.content(text)
        r.finish()


class Updates:
    """The ``notifications/resources/updated`` a 2025-era session receives, in order."""

    def __init__(self) -> None:
        self.send, self.recv = anyio.create_memory_object_stream[str](1000)

    async def handler(self, message: Any) -> None:
        if getattr(message, "method", None) == UPDATED:
            self.send.send_nowait(message.params.uri)

    async def until(self, *wanted: str, within: float = 10.0) -> list[str]:
        """Everything received until each of ``wanted`` has come at least once."""
        got: list[str] = []
        with anyio.fail_after(within):
            while not set(wanted) <= set(got):
                got.append(await self.recv.receive())
        return got


async def events_until(sub: Any, *wanted: str, within: float = 10.0) -> list[str]:
    """The URIs of a listen stream's events until each of ``wanted`` has come."""
    got: list[str] = []
    with anyio.fail_after(within):
        async for event in sub:
            got.append(event.uri)
            if set(wanted) <= set(got):
                break
    return got


async def eventually(pred: Callable[[], bool], within: float = 10.0) -> None:
    """Poll ``pred`` (server state with no event to wait on) until true, or fail."""
    with anyio.fail_after(within):
        while True:
            if pred():
                return
            await anyio.sleep(0.01)


async def status_of(c: Client, uri: str) -> dict[str, Any]:
    [content] = (await c.read_resource(uri)).contents
    assert content.mime_type == "application/json"
    out: dict[str, Any] = json.loads(getattr(content, "text", ""))
    return out


# --------------------------------------------------------------------------- 2025 era


def test_subscribed_log_and_status_notify_and_unsubscribe_stops_them(home: Home) -> None:
    conv = a_conversation(home)
    log_uri, status_uri = uris(conv)
    server = mcp_server.build_server(settings_for(home))

    async def main() -> dict[str, Any]:
        ups = Updates()
        async with Client(server, mode="legacy", message_handler=ups.handler) as c:
            assert c.server_capabilities.resources is not None
            assert c.server_capabilities.resources.subscribe is True
            listed = {str(r.uri) for r in (await c.list_resources()).resources}
            assert {log_uri, status_uri} <= listed
            await c.subscribe_resource(log_uri)
            await c.subscribe_resource(status_uri)
            await c.subscribe_resource(status_uri)  # twice is once
            # the model asks for context: the log grows and the status now has a pending need
            model_replies(conv, "I need context.\nNEED: the schema", "r1")
            both = await ups.until(log_uri, status_uri)
            status = await status_of(c, status_uri)
            assert [w["need"] for w in status["waiting"]] == ["the schema"]

            await c.unsubscribe_resource(log_uri)
            assert set(server.subs.watches) == {status_uri}
            with open_writer(conv) as w:  # the log changes, unwatched now ...
                w.append_block("CLAUDE", "OLLAMA", "a note", msg_id="m2")
            drop_message(conv, "queued")  # ... then the status (a queued message)
            first = await ups.until(status_uri)
            drop_message(conv, "queued too")  # a fence: anything from before has arrived
            second = await ups.until(status_uri)
            return {"both": both, "after": first + second, "status": await status_of(c, status_uri)}

    out = asyncio.run(main())
    assert {log_uri, status_uri} <= set(out["both"])
    assert log_uri not in out["after"], out["after"]
    assert out["status"]["queued_messages"] == 2
    # the session ended: nothing of it is left
    assert server.subs.watches == {} and server.subs.peers == {}


def test_a_session_that_ends_takes_its_subscriptions_and_others_keep_theirs(home: Home) -> None:
    conv = a_conversation(home)
    log_uri, status_uri = uris(conv)
    server = mcp_server.build_server(settings_for(home))

    async def main() -> list[str]:
        ups_b = Updates()
        async with Client(server, mode="legacy", message_handler=ups_b.handler) as b:
            async with Client(server, mode="legacy") as a:
                await a.subscribe_resource(log_uri)
                await a.subscribe_resource(status_uri)
                await b.subscribe_resource(log_uri)
                assert server.subs.watches[log_uri].holders == 2
                assert len(server.subs.peers) == 2
            # a went away (and it may have run the poller); b stays subscribed and is told
            await eventually(lambda: len(server.subs.peers) == 1)
            assert set(server.subs.watches) == {log_uri}
            assert server.subs.watches[log_uri].holders == 1
            model_replies(conv, "Here is the plan.", "r1")
            return await ups_b.until(log_uri)

    assert asyncio.run(main()) == [f"conversation://{conv.id}/log"]
    assert server.subs.watches == {} and server.subs.peers == {}


def test_subscription_limits_and_bad_resources_are_clear_errors(home: Home) -> None:
    convs = [a_conversation(home, f"c{i}") for i in range(3)]
    limits = Limits(max_subscriptions=2, max_watched=3)
    server = mcp_server.build_server(settings_for(home), limits)
    logs = [uris(c)[0] for c in convs]
    statuses = [uris(c)[1] for c in convs]

    async def refused(c: Client, uri: str) -> str:
        with pytest.raises(MCPError) as err:
            await c.subscribe_resource(uri)
        return str(err.value)

    async def main() -> list[str]:
        async with (
            Client(server, mode="legacy") as a,
            Client(server, mode="legacy") as b,
        ):
            await a.subscribe_resource(logs[0])
            await a.subscribe_resource(logs[1])
            await a.subscribe_resource(logs[1])  # held already: no new slot
            per_session = await refused(a, logs[2])
            await b.subscribe_resource(logs[2])  # a third resource, the server's last slot
            server_wide = await refused(b, statuses[0])
            await b.subscribe_resource(logs[0])  # watched already: shares the slot
            return [
                per_session,
                server_wide,
                await refused(b, "conversation://no-such-conversation/log"),
                await refused(b, f"conversation://{convs[0].id}/messages"),
                await refused(b, "file:///etc/passwd"),
            ]

    per_session, server_wide, unknown, wrong_kind, foreign = asyncio.run(main())
    assert "at most 2 subscriptions per session" in per_session
    assert "at most 3 resources at once" in server_wide
    assert "no conversation matches 'no-such-conversation'" in unknown
    for msg in (wrong_kind, foreign):
        assert "conversation://<id>/log or /status" in msg


# --------------------------------------------------------------------------- 2026 era


def test_listen_stream_gets_updates_follows_an_archive_and_lets_go_on_close(home: Home) -> None:
    conv = a_conversation(home)
    log_uri, status_uri = uris(conv)
    server = mcp_server.build_server(settings_for(home))

    async def main() -> tuple[list[str], list[str], dict[str, Any], int]:
        async with Client(server) as c:
            assert c.protocol_version == "2026-07-28"
            async with c.listen(resource_subscriptions=[log_uri, status_uri]) as sub:
                assert set(server.subs.watches) == {log_uri, status_uri}
                model_replies(conv, "Which tables?\nNEED: the table list", "r1")
                first = await events_until(sub, log_uri, status_uri)
                await c.call_tool("conversation_archive", {"conversation_id": conv.id})
                archived = await events_until(sub, status_uri)
                status = await status_of(c, status_uri)
            await eventually(lambda: not server.subs.watches)
            return first, archived, status, len(server.subs.watches)

    first, archived, status, left = asyncio.run(main())
    assert set(first) == {log_uri, status_uri}
    assert status_uri in archived
    assert status["archived"] is True and "archived" in status["hint"]
    assert left == 0


def test_listen_limits(home: Home) -> None:
    conv = a_conversation(home)
    limits = Limits(max_subscriptions=1, max_listen_streams=1)
    server = mcp_server.build_server(settings_for(home), limits)

    async def main() -> list[str]:
        errors: list[str] = []
        async with Client(server) as c:
            with pytest.raises(MCPError) as err:
                async with c.listen(resource_subscriptions=list(uris(conv))):
                    pass
            errors.append(str(err.value))
            with pytest.raises(MCPError) as err:
                async with c.listen(resource_subscriptions=["conversation://nope/status"]):
                    pass
            errors.append(str(err.value))
            async with c.listen(resource_subscriptions=[uris(conv)[0]]):
                with pytest.raises(MCPError) as err:
                    async with c.listen(resource_subscriptions=[uris(conv)[1]]):
                        pass
                errors.append(str(err.value))
        return errors

    too_many, unknown, streams = asyncio.run(main())
    assert "at most 1 resources per listen stream" in too_many
    assert "no conversation matches 'nope'" in unknown
    assert "Subscription limit reached" in streams
    assert server.subs.watches == {}


# --------------------------------------------------------------------------- real processes


def stdio_params(env: dict[str, str]) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["-m", "contemplation", "mcp"], env=env, cwd=str(ROOT)
    )


async def tool(c: Client, name: str, **args: Any) -> dict[str, Any]:
    result = await c.call_tool(name, args)
    assert not result.is_error, result.content
    out: dict[str, Any] = json.loads(getattr(result.content[0], "text", ""))
    return out


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_stdio_subscription_follows_a_real_daemon_from_an_empty_start(
    mode: str,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    """The agent starts a conversation empty, subscribes to its status, sends the first
    message and learns from notifications alone when the model waits for it."""
    env = base_env(home, fake_ollama, CONTEMPLATION_DASHBOARD_ENABLED="false")
    daemon_factory(env, home).wait_ready()
    fake_ollama.enqueue(Step(text="Which database?\nNEED: the database engine"))

    async def follow(c: Client, status_uri: str, next_update: Callable[[], Any]) -> list[str]:
        """Read the status after each notification until the model waits for the agent."""
        seen: list[str] = []
        with anyio.fail_after(30):
            while not seen or seen[-1] != "awaiting_agent":
                await next_update()
                seen.append((await status_of(c, status_uri))["status"])
        return seen

    async def main() -> tuple[dict[str, Any], list[str], dict[str, Any], dict[str, Any]]:
        ups = Updates()
        async with Client(stdio_params(env), mode=mode, message_handler=ups.handler) as c:
            assert c.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
            started = await tool(c, "conversation_start", topic="Storage")
            cid = started["conversation_id"]
            status_uri = f"conversation://{cid}/status"
            empty = await status_of(c, status_uri)
            assert empty["status"] == "pending" and "empty" in empty["hint"]
            if mode == "legacy":
                await c.subscribe_resource(status_uri)
                await tool(c, "conversation_respond", conversation_id=cid, response="Store what?")
                seen = await follow(c, status_uri, lambda: ups.until(status_uri, within=30))
            else:
                async with c.listen(resource_subscriptions=[status_uri]) as sub:
                    await tool(
                        c, "conversation_respond", conversation_id=cid, response="Store what?"
                    )
                    seen = await follow(
                        c, status_uri, lambda: events_until(sub, status_uri, within=30)
                    )
            check = await tool(c, "conversation_check", conversation_id=cid)
            mine = await tool(c, "conversation_check", conversation_id=cid, include_own=True)
            return started, seen, check, mine

    started, seen, check, mine = asyncio.run(main())
    assert started["created"] and "empty" in started["hint"]
    assert seen[-1] == "awaiting_agent"
    assert [w["need"] for w in check["waiting"]] == ["the database engine"]
    assert [b["kind"] for b in check["blocks"]] == ["model"]
    assert [b["kind"] for b in mine["blocks"]] == ["agent", "model"]
    assert mine["blocks"][0]["text"] == "Store what?"


def http_server(home: Home) -> tuple[mcp_http.HttpFace, Callable[[], Any]]:
    """``contemplation mcp --http`` on a free port, listening, and a maker of transports to
    it that send its token (each ``mcp.Client`` takes a fresh one)."""
    face = mcp_http.serve(home)
    return face, lambda: mcp_http.bearer(face.url, face.token)


def test_streamable_http_subscriptions_in_both_eras(home: Home) -> None:
    """Over HTTP: a 2025 session hears on its standalone stream, a 2026 one on its listen
    stream."""
    conv = a_conversation(home)
    log_uri, _ = uris(conv)

    async def main() -> tuple[list[str], list[str]]:
        ups = Updates()
        async with (
            Client(url(), mode="legacy", message_handler=ups.handler) as old,
            Client(url()) as new,
        ):
            await old.subscribe_resource(log_uri)
            async with new.listen(resource_subscriptions=[log_uri]) as sub:
                model_replies(conv, "First.", "r1")
                heard_old = await ups.until(log_uri)
                heard_new = await events_until(sub, log_uri)
        return heard_old, heard_new

    server, url = http_server(home)
    try:
        heard_old, heard_new = asyncio.run(main())
    finally:
        server.stop()
    assert heard_old == [log_uri] and heard_new == [log_uri]


# --------------------------------------------------------------------------- fast turns


def fast_turn(conv: Conv, n: int) -> None:
    """One whole turn written the way the daemon writes it (the agent's message, generating,
    the reply, idle again) in one go: tens of milliseconds, well within one poll (0.25 s)."""
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", f"Question {n}?", msg_id=f"q{n}")
        w.show(Status.GENERATING)
        r = w.reply("OLLAMA", "CLAUDE", f"a{n}")
        r.content(f"Answer {n}.")
        r.finish()
        w.show(Status.IDLE)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_a_status_subscriber_hears_every_turn_even_one_faster_than_a_poll(
    transport: str, mode: str, home: Home
) -> None:
    """idle → a whole turn → idle between two looks of the poller: the status word is the
    same before and after, and a status-only subscriber still hears each finished turn (the
    status carries the turns finished and the log's end, which only grow)."""
    conv = a_conversation(home)
    model_replies(conv, "First.", "r1")
    with open_writer(conv) as w:
        w.show(Status.IDLE)
    _, status_uri = uris(conv)
    lock = DaemonLock(home)  # a daemon runs: the status is a settled "idle"
    lock.acquire()

    async def session(c: Client, next_update: Callable[[], Any]) -> list[dict[str, Any]]:
        seen = [await status_of(c, status_uri)]
        for n in (2, 3):
            fast_turn(conv, n)
            heard = seen[-1]
            with anyio.fail_after(10):  # a poll is every 0.25 s: one comes well within
                while heard.get("turns") == seen[-1].get("turns"):
                    await next_update()  # only a notification makes it look again
                    heard = await status_of(c, status_uri)
            seen.append(heard)
        return seen

    async def main(target: Any) -> list[dict[str, Any]]:
        ups = Updates()
        async with Client(target, mode=mode, message_handler=ups.handler) as c:
            if mode == "legacy":
                await c.subscribe_resource(status_uri)
                return await session(c, lambda: ups.until(status_uri))
            async with c.listen(resource_subscriptions=[status_uri]) as sub:
                return await session(c, lambda: events_until(sub, status_uri))

    server = None
    try:
        if transport == "stdio":
            seen = asyncio.run(main(stdio_params(base_env(home))))
        else:
            server, url = http_server(home)
            seen = asyncio.run(main(url()))
    finally:
        lock.release()
        if server is not None:
            server.stop()
    assert [s["status"] for s in seen] == ["idle", "idle", "idle"]
    assert [s["turns"] for s in seen] == [1, 2, 3]
    assert seen[0]["cursor"] < seen[1]["cursor"] < seen[2]["cursor"] == conv.log.stat().st_size
