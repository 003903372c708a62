"""Approvals are the person's, outside tasks too: the real MCP SDK client (``ClientSession``
with an elicitation callback, over stdio to the real ``contemplation mcp`` process) waits with
``conversation_wait`` while a real daemon runs a turn whose lookup a ``[permissions]`` rule
marks ``ask``: the lookup comes to the person as an elicitation form, and their answer is the
decision, recorded as ``conversation_approve`` records one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from contemplation.faces.reading import Reader
from contemplation.store.layout import Home, read_json
from tests.conftest import ROOT, DaemonProc, base_env, cli
from tests.fakes.ollama_server import FakeOllama, Step

Answer = Callable[[types.ElicitRequestParams], types.ElicitResult]


def asking_setup(
    tmp_path: Path, home: Home, fake_ollama: FakeOllama
) -> tuple[dict[str, str], Path]:
    notes = tmp_path / "notes"
    notes.mkdir()
    secret = notes / "secret.md"
    secret.write_text("the launch code")
    cfg = tmp_path / "config.toml"
    cfg.write_text(
        f'[tools]\nallowed_roots = ["{notes}"]\n\n[permissions]\nread_file = {{ "*secret*" = "ask" }}\n'
    )
    env = base_env(
        home, fake_ollama, CONTEMPLATION_CONFIG=str(cfg), CONTEMPLATION_DASHBOARD_ENABLED="false"
    )
    return env, secret


@contextlib.asynccontextmanager
async def session(env: dict[str, str], on_elicit: Any) -> AsyncIterator[ClientSession]:
    """The SDK's own client over stdio to a real ``contemplation mcp``, initialized; it takes
    forms when ``on_elicit`` is given."""
    params = StdioServerParameters(
        command=sys.executable, args=["-P", "-m", "contemplation", "mcp"], env=env, cwd=str(ROOT)
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, elicitation_callback=on_elicit) as s,
    ):
        await s.initialize()
        yield s


async def start(s: ClientSession, secret: Path, topic: str = "Ask") -> str:
    """conversation_start with a message that makes the model ask for ``secret``. Identical
    starts within two minutes are one conversation (actions.SAME_ARGS_WINDOW): a second
    conversation in one test needs a ``topic`` of its own."""
    started = await s.call_tool(
        "conversation_start", {"topic": topic, "initial_prompt": f"Read {secret}", "model": "gemma"}
    )
    return str(json.loads(getattr(started.content[0], "text", ""))["conversation_id"])


async def converse(
    env: dict[str, str], answer: Answer | None, secret: Path
) -> tuple[dict[str, Any], list[types.ElicitRequestParams]]:
    """Start a conversation and wait for it once (45 s) through the SDK's own client."""
    asked: list[types.ElicitRequestParams] = []

    async def on_elicit(_: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        assert answer is not None
        return answer(params)

    async with session(env, on_elicit if answer else None) as s:
        cid = await start(s, secret)
        waited = await s.call_tool("conversation_wait", {"conversation_id": cid, "timeout_s": 45})
        assert not waited.is_error, waited.content
        return json.loads(getattr(waited.content[0], "text", "")), asked


def test_a_lookup_marked_ask_is_asked_of_the_person_while_conversation_wait_waits(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(
        Step(text=f"NEED: File contents of {secret}"), Step(text="Thanks, I have read it.")
    )
    daemon_factory(env, home).wait_ready()

    def allow_once(params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"decision": "once"})

    out, asked = asyncio.run(converse(env, allow_once, secret))
    [form] = asked
    assert isinstance(form, types.ElicitRequestFormParams)
    assert str(secret) in form.message and "ask" in form.message  # what is read, and why
    choices = form.requested_schema["properties"]["decision"]["oneOf"]
    assert [c["const"] for c in choices] == ["once", "always", "reject"]
    # one wait: the decision went on, the lookup ran and the model's reply came back in it
    assert out["blocks"][-1]["text"] == "Thanks, I have read it.", out
    conv = Reader(home).locate(out["conversation_id"])
    assert "the launch code" in conv.log.read_text()
    meta = read_json(conv.metadata)
    assert meta is not None
    [decided] = meta["approvals"]
    assert decided["decision"] == "once" and decided["face"] == "form"  # the person's, in a form


def test_a_client_without_elicitation_keeps_conversation_approve(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"))
    daemon_factory(env, home).wait_ready()
    out, asked = asyncio.run(converse(env, None, secret))
    assert asked == []
    [item] = out["waiting"]
    assert item["kind"] == "approval" and "conversation_approve" in json.dumps(item)


async def agent_approves(
    env: dict[str, str], secret: Path, *, forms: bool, topic: str = "Ask"
) -> tuple[str, str]:
    """The agent starts a conversation whose lookup asks, and (the lookup waiting) calls
    conversation_approve itself; returns the conversation's id and what the call said."""

    async def never(_: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        raise AssertionError("no form is put to the person here: nobody waits")

    async with session(env, never if forms else None) as s:
        cid = await start(s, secret, topic)
        for _ in range(400):  # the lookup comes to wait for approval: a bounded poll
            checked = await s.call_tool("conversation_check", {"conversation_id": cid})
            if "approval" in getattr(checked.content[0], "text", ""):
                break
            await asyncio.sleep(0.05)
        else:  # the approval below must be of a lookup that waits, not of nothing
            raise AssertionError(f"no lookup came to wait for approval: {checked.content}")
        done = await s.call_tool("conversation_approve", {"conversation_id": cid, "decision": "always"})
        return cid, ("ERROR " if done.is_error else "") + getattr(done.content[0], "text", "")


def test_the_agent_cannot_take_the_persons_decision_when_its_client_shows_forms(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    """With a client that shows forms, the agent's conversation_approve is
    refused in one line that says where the person decides, and nothing is decided; the
    person's decision at the CLI then goes through, recorded as the person's."""
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"), Step(text="Read."))
    daemon_factory(env, home).wait_ready()
    cid, said = asyncio.run(agent_approves(env, secret, forms=True))
    assert said.startswith("ERROR ") and "are the person's to decide" in said, said
    assert "in their own terminal" in said and "agent_approves" in said
    assert "contemplation approve" not in said  # the agent reads it: no command to paste
    conv = Reader(home).locate(cid)
    assert (read_json(conv.metadata) or {}).get("approvals", []) == []
    assert "the launch code" not in conv.log.read_text()
    done = cli(env, "approve", cid, "--reject")
    assert done.returncode == 0, done.stderr
    again = cli(env, "approve", cid, "--once", check=False)
    assert again.returncode == 1 and "by the person (the CLI)" in again.stderr, again.stderr


def test_without_forms_the_agent_decides_unless_the_person_says_never(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    """A client that shows no forms leaves the agent as the one asked (recorded as the
    agent's); agent_approves = "never" keeps the decision with the person even then."""
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(
        Step(text=f"NEED: File contents of {secret}"),
        Step(text="Read."),
        Step(text=f"NEED: File contents of {secret}"),
    )
    daemon_factory(env, home).wait_ready()
    cid, said = asyncio.run(agent_approves(env, secret, forms=False))
    assert not said.startswith("ERROR "), said
    meta = read_json(Reader(home).locate(cid).metadata) or {}
    assert [(d["decision"], d["face"]) for d in meta["approvals"]] == [("always", "mcp")]
    env["CONTEMPLATION_AGENT_APPROVES"] = "never"
    # a conversation of its own whose lookup waits (the first one's start repeated would be
    # the first conversation again, its lookup long decided)
    again, refused = asyncio.run(agent_approves(env, secret, forms=False, topic="Ask again"))
    assert refused.startswith("ERROR ") and 'agent_approves = "never"' in refused, refused
    assert (read_json(Reader(home).locate(again).metadata) or {}).get("approvals", []) == []


async def wait_unanswered(
    env: dict[str, str], secret: Path, timeout_s: float
) -> tuple[dict[str, Any], float, int]:
    """conversation_wait through the SDK's client whose person never answers the form (the
    callback waits until the session ends); returns the result, the seconds the call took
    and how many forms were put."""
    asked: list[types.ElicitRequestParams] = []

    async def never_answers(_: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params)
        await asyncio.Event().wait()  # the person is away: only the session's end ends this
        raise AssertionError("unreachable")

    async with session(env, never_answers) as s:
        cid = await start(s, secret)
        t0 = asyncio.get_running_loop().time()
        waited = await asyncio.wait_for(
            s.call_tool("conversation_wait", {"conversation_id": cid, "timeout_s": timeout_s}),
            timeout_s + 60,  # the old code held the call 600 s a form: fail, not hang
        )
        took = asyncio.get_running_loop().time() - t0
        assert not waited.is_error, waited.content
        return json.loads(getattr(waited.content[0], "text", "")), took, len(asked)


def test_a_form_nobody_answers_never_holds_the_wait_past_its_bound(
    tmp_path: Path,
    home: Home,
    fake_ollama: FakeOllama,
    daemon_factory: Callable[..., DaemonProc],
) -> None:
    """conversation_wait returns within its timeout (at most 50 s, as the
    Claude guide promises) although the form it put to the person is left unanswered; the result
    says the form is still pending and what to call next, and nothing is decided."""
    env, secret = asking_setup(tmp_path, home, fake_ollama)
    fake_ollama.enqueue(Step(text=f"NEED: File contents of {secret}"))
    daemon_factory(env, home).wait_ready()
    out, took, forms = asyncio.run(wait_unanswered(env, secret, 6.0))
    print(f"wait with an unanswered form returned after {took:.2f} s (timeout_s 6)")
    assert forms == 1
    assert took < 6.0 + 5.0, took  # its bound, plus the load of a shared machine
    assert out["timed_out"] is True, out
    [pending] = out["forms_pending"]
    [item] = out["waiting"]
    assert pending == item["id"] and item["kind"] == "approval"
    assert "conversation_wait" in out["hint"] and "in their own terminal" in out["hint"], out
    assert "contemplation approve" not in out["hint"]
    conv = Reader(home).locate(out["conversation_id"])
    assert (read_json(conv.metadata) or {}).get("approvals", []) == []
    assert "the launch code" not in conv.log.read_text()
