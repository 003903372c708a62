"""The agent's loop is exact: what waits for the agent is one list of needs to
answer and lookups to approve, with ids that never shift; neither command takes the other's
item; every face lists each item with the command that settles it; cursors miss nothing.

One reply asks for three things: a file the permissions mark ``ask``, a ``.env`` (denied by
default) and "The release manager" (no rule answers it), against the scripted fake Ollama
(the model's side of the NEED protocol) with the real router, files tool and permissions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation import settings as settings_mod
from contemplation.engine.runtime import Runtime
from contemplation.errors import InputRejected
from contemplation.faces import actions
from contemplation.faces.reading import Reader
from contemplation.models import Status
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama, Step

MANAGER = "The release manager"


def _mixed(
    home: Home, fake: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> tuple[Conv, Callable[[], Runtime], list[str]]:
    """A conversation stopped at the mixed reply, and a maker of runtimes for more bursts."""
    notes = tmp_path / "notes"
    (notes / "secrets").mkdir(parents=True)
    (notes / "secrets" / "plan.md").write_text("the secret plan")
    (notes / ".env").write_text("API_KEY=hunter2")
    needs = [
        f"File contents of {notes / 'secrets' / 'plan.md'}",
        f"File contents of {notes / '.env'}",
        MANAGER,
    ]

    def rt() -> Runtime:
        s = make_settings(
            fake,
            tools={"allowed_roots": [str(notes)]},
            permissions={"read_file": {"*secrets*": "ask"}},
        )
        return Runtime(settings=s, home=Home(s.home))

    conv = new_conversation(
        home, "loop", template=load_template(home, "default"), model="gemma", backend="ollama"
    )
    drop_message(conv, "Who ships, and what is the plan?")
    fake.enqueue(Step(text="\n".join(f"NEED: {n}" for n in needs)), Step(text="Alice ships."))
    run_burst(rt())
    return conv, rt, needs


def test_one_list_with_kinds_and_ids_that_never_shift(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    conv, rt, needs = _mixed(home, fake_ollama, make_settings, tmp_path)
    st = read_state(conv)
    assert st is not None and st.status is Status.AWAITING_APPROVAL
    log = conv.log.read_text()
    assert "NOT ANSWERED (refused)" in log and "hunter2" not in log  # .env: refused, not listed
    reader = Reader(home)
    items = reader.waiting(conv)
    assert [(i.kind, i.need) for i in items] == [("approval", needs[0]), ("need", MANAGER)]
    lookup, need = items
    assert lookup.id != need.id and lookup.tool == "files.read"
    s = make_settings()

    # defect 1: the agent's chat text never answers a lookup
    with pytest.raises(InputRejected, match="is a lookup waiting for approval") as e1:
        actions.respond(s, reader, conv, "ok go ahead", lookup.id)
    assert f"contemplation approve {conv.id} --need {lookup.id}" in str(e1.value)
    with pytest.raises(InputRejected, match="is a lookup waiting for approval") as e2:
        actions.respond(s, reader, conv, "ok go ahead", lookup.id, face="mcp")
    assert f'conversation_approve(conversation_id="{conv.id}", need="{lookup.id}"' in str(e2.value)
    # ...and approve never takes a need
    with pytest.raises(InputRejected, match="is a need to answer") as e3:
        actions.approve(s, conv, "once", need.id)
    assert f'contemplation respond {conv.id} "…" --need {need.id}' in str(e3.value)

    # defect 2: respond with no --need answers the one need, never the lookup
    done = actions.respond(s, reader, conv, "Alice is the release manager")
    assert (done["answered"], done["need_id"]) == (MANAGER, need.id)
    assert [(i["id"], i["kind"]) for i in done["still_waiting"]] == [(lookup.id, "approval")]
    # the ids did not shift: the lookup keeps its id; the answered need is no longer listed
    assert [(i.id, i.kind) for i in reader.waiting(conv)] == [(lookup.id, "approval")]
    assert read_state(conv).pending_approvals[0].id == lookup.id  # type: ignore[union-attr]
    # only a lookup waits now: text is refused, and says how to decide or to send anyway
    with pytest.raises(InputRejected, match="waits for the approval of 1 lookup") as e4:
        actions.respond(s, reader, conv, "ok go ahead")
    assert "contemplation send" in str(e4.value)
    plain = actions.respond(s, reader, conv, "by the way", plain=True)
    assert plain["answered"] is None and (conv.inbox / plain["queued"]).is_file()
    (conv.inbox / plain["queued"]).unlink()

    approved = actions.approve(s, conv, "once")  # the one lookup: no id needed
    assert approved["request"] == lookup.id and approved["still_waiting"] == []
    run_burst(rt())
    blocks = parse(conv.log.read_bytes()).blocks
    answers = {b.response_to: b.text for b in blocks if b.response_to}
    assert "the secret plan" in answers[needs[0]] and "(source: files.read," in answers[needs[0]]
    assert "ok go ahead" not in conv.log.read_text()
    assert "Alice is the release manager" in answers[MANAGER]
    assert blocks[-1].text == "Alice ships."
    assert reader.waiting(conv) == []


def test_ambiguous_respond_is_refused_and_ids_name_exactly(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = new_conversation(
        home, "two", template=load_template(home, "default"), model="gemma", backend="ollama"
    )
    drop_message(conv, "go")
    fake_ollama.enqueue(Step(text="NEED: The schema\nNEED: The counts"), Step(text="ok"))
    s = make_settings(fake_ollama)
    run_burst(Runtime(settings=s, home=Home(s.home)))
    reader = Reader(home)
    schema, counts = reader.waiting(conv)
    with pytest.raises(InputRejected, match=r"2 needs wait in .*name the one") as e:
        actions.respond(s, reader, conv, "x")
    assert schema.id in str(e.value) and counts.id in str(e.value)
    with pytest.raises(InputRejected, match=r"nothing waiting in .* is '2'"):
        actions.respond(s, reader, conv, "x", "2")  # numbers shift; ids do not
    done = actions.respond(s, reader, conv, "12 rows", counts.id[:5])
    assert done["answered"] == "The counts"
    # the other keeps its id, and a repeat of the answered id is refused with what waits
    assert [i.id for i in reader.waiting(conv)] == [schema.id]
    with pytest.raises(InputRejected, match=f"waiting: {schema.id} \\(need\\): The schema"):
        actions.respond(s, reader, conv, "again", counts.id)


def test_every_face_lists_both_kinds_with_the_command(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    from mcp import Client

    from contemplation.faces.mcp import server as mcp_server
    from tests.system.test_mcp_server import tool, tool_error

    conv, _, needs = _mixed(home, fake_ollama, make_settings, tmp_path)
    lookup, need = Reader(home).waiting(conv)
    settings = settings_mod.load(home=home.root, env={}, config=None)

    async def session() -> tuple[dict[str, Any], str, dict[str, Any]]:
        async with Client(mcp_server.build_server(settings)) as c:
            check = await tool(c, "conversation_check", conversation_id=conv.id)
            wrong = await tool_error(
                c,
                "conversation_respond",
                conversation_id=conv.id,
                response="ok go ahead",
                need=lookup.id,
            )
            res = await c.read_resource(f"conversation://{conv.id}/status")
            status = json.loads(getattr(res.contents[0], "text", ""))
            return check, wrong, status

    check, wrong, status = asyncio.run(session())
    for snap in (check, status):
        assert [(w["id"], w["kind"]) for w in snap["waiting"]] == [
            (lookup.id, "approval"),
            (need.id, "need"),
        ]
        assert snap["waiting"][0]["how"].startswith("conversation_approve(")
        assert snap["waiting"][1]["how"].startswith("conversation_respond(")
        assert "conversation_approve" in snap["hint"] and "conversation_respond" in snap["hint"]
        assert snap["activity"].startswith("waiting for your approval of 1 lookup(s)")
    assert "is a lookup waiting for approval" in wrong
    assert f'conversation_approve(conversation_id="{conv.id}", need="{lookup.id}"' in wrong
    # a check without a cursor starts after the agent's own message: the reply that asked is
    # there, and so is the rule's refusal of the .env written after it
    assert [b["kind"] for b in check["blocks"]] == ["model", "agent"]
    assert check["blocks"][0]["needs"] == needs
    assert check["blocks"][1]["response_to"] == needs[1]


def test_wait_reports_progress_while_the_model_works(home: Home) -> None:
    """conversation_wait sends progress notifications (to the caller's progressToken) with
    what is happening, and returns under its cap with the cursor to go on."""
    from mcp import Client

    from contemplation.faces.mcp import server as mcp_server
    from contemplation.faces.mcp.calls import Limits
    from contemplation.writer import DaemonLock

    limits = Limits(progress_every=0.2, wait_cap=1.2)
    settings = settings_mod.load(home=home.root, env={}, config=None)
    lock = DaemonLock(home)  # a daemon that holds the lock but never takes the message
    lock.acquire()
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def session() -> dict[str, Any]:
        async with Client(mcp_server.build_server(settings, limits)) as c:
            started = await c.call_tool(
                "conversation_start", {"topic": "p", "initial_prompt": "hello"}
            )
            cid = json.loads(getattr(started.content[0], "text", ""))["conversation_id"]
            res = await c.call_tool(
                "conversation_wait",
                {"conversation_id": cid, "since": 0, "timeout_s": 60},
                progress_callback=on_progress,
            )
            out = json.loads(getattr(res.content[0], "text", ""))
            assert isinstance(out, dict)
            return out

    try:
        out = asyncio.run(session())
    finally:
        lock.release()
    assert out["timed_out"] is True and out["cursor"] == 0
    assert out["activity"] == "queued: the daemon takes it next"
    assert out["hint"].startswith("Still running (queued: the daemon takes it next)")
    assert len(seen) >= 2
    assert all(m == "queued: the daemon takes it next" for _, _, m in seen)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen) and seen[0][1] == 1.2
