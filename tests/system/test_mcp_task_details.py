"""The smaller MCP findings. (a) A long result cut to the page budget said "more
follows: call again with the returned cursor"; in a task started by conversation_start that
call starts a new conversation. Every such ``next`` names the tool that pages it
(conversation_check), the conversation and the cursor. (b) ``tasks/get``'s ``lastUpdatedAt``
stayed at the state file's time while ``statusMessage`` changed every second (a turn
generating); it moves whenever the status or the message changes, and only then. Real
folders written by the real writer; the tasks' bodies called as the MCP server calls them."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from contemplation.faces.mcp.calls import Faces
from contemplation.faces.mcp.tasks import Tasks
from contemplation.models import Status
from contemplation.protocol import paging
from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation, open_writer
from contemplation.writer.files import DaemonLock
from tests.system.test_mcp_server import settings_for

LONG = "\n".join(f"line {i:05d} of a long answer" for i in range(4_000))  # ~110 kB


def _conv(home: Home) -> Conv:
    return new_conversation(
        home, "pages", template=load_template(home, "default"), model="m", backend="ollama"
    )


def _long_reply(conv: Conv) -> None:
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "write a lot", msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content(LONG)
        r.finish()
        w.set_status(Status.IDLE)


NEXT = re.compile(
    r'call conversation_check with conversation_id="(?P<conv>[^"]+)" and cursor=(?P<cursor>\d+)'
)


def _follow(faces: Faces, out: dict[str, Any]) -> str:
    """Read on from a cut result exactly as its ``next`` says; the text of the reply."""
    text = "".join(b["text"] for b in out["blocks"] if b["kind"] == "model")
    for _ in range(100):
        if "cut" not in out:
            return text
        said = out["cut"]["next"]
        m = NEXT.search(said)
        assert m is not None, said
        assert m["conv"] == out["conversation_id"] and int(m["cursor"]) == out["cursor"]
        args: dict[str, Any] = {}
        if "include_own=true" in said:
            args["include_own"] = True
        out = faces.check(m["conv"], int(m["cursor"]), **args)
        text += "".join(b["text"] for b in out["blocks"] if b["kind"] == "model")
    raise AssertionError("never reached the end")


def test_a_long_task_result_names_conversation_check_and_the_cursor(home: Home) -> None:
    """The task of conversation_start completes with the reply cut to the page budget: its
    ``next`` names conversation_check, the conversation and the cursor (not "call again",
    which for conversation_start starts another conversation); following it reads the rest."""
    conv = _conv(home)
    faces = Faces(settings_for(home))
    tasks = Tasks(faces)
    created = tasks.create(conv.id, 0, "conversation_start")
    _long_reply(conv)
    done = tasks.get(created["taskId"])
    assert done["status"] == "completed", done
    out = json.loads(done["result"]["content"][0]["text"])
    assert "cut" in out and paging.size(out["blocks"]) <= paging.PAGE_BYTES
    assert "call again" not in out["cut"]["next"].split(";")[0]
    assert _follow(faces, out) == LONG


@pytest.mark.parametrize("include_own", [False, True])
def test_a_cut_check_and_wait_name_the_call_that_reads_on(home: Home, include_own: bool) -> None:
    """conversation_check and conversation_wait cut the same way, and say the same call; one
    that showed the agent's own blocks says to go on showing them."""
    import anyio

    conv = _conv(home)
    _long_reply(conv)
    faces = Faces(settings_for(home))
    checked = faces.check(conv.id, 0, include_own=include_own, max_bytes=4_000)
    waited = anyio.run(lambda: faces.wait(conv.id, 0, 0, include_own=include_own))
    for out in (checked, waited):
        assert ("include_own=true" in out["cut"]["next"]) is include_own
        assert _follow(faces, out) == LONG


@pytest.fixture
def daemon_lock(home: Home) -> Iterator[None]:
    lock = DaemonLock(home)  # held as a running daemon holds it: the task is not "stalled"
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def test_last_updated_moves_with_the_status_message_and_only_with_it(
    home: Home, daemon_lock: None
) -> None:
    """A turn generating: its statusMessage counts the seconds ("generating for 3 s") with no
    file changing; each new message comes with a later lastUpdatedAt, the same message with
    the same one, and the task's completion moves it again."""
    conv = _conv(home)
    tasks = Tasks(Faces(settings_for(home)))
    created = tasks.create(conv.id, 0, "conversation_start")
    task_id = created["taskId"]
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "hello?", msg_id="m1")
        w.state.generating_since = time.time() - 3
        w.set_status(Status.GENERATING)
    seen: list[dict[str, Any]] = []
    for _ in range(3):
        seen.append(tasks.get(task_id))
        seen.append(tasks.get(task_id))  # at once: most often the same message
        time.sleep(1.05)
    for task in seen:
        assert task["status"] == "working" and task["statusMessage"].startswith("generating for")
        assert task["lastUpdatedAt"] >= created["createdAt"]
    for a, b in zip(seen, seen[1:], strict=False):
        if a["statusMessage"] == b["statusMessage"]:
            assert b["lastUpdatedAt"] == a["lastUpdatedAt"], (a, b)
        else:
            assert b["lastUpdatedAt"] > a["lastUpdatedAt"], (a, b)
    assert len({t["statusMessage"] for t in seen}) >= 3  # the seconds did go by
    with open_writer(conv) as w:
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content("hello!")
        r.finish()
        w.set_status(Status.IDLE)
    done = tasks.get(task_id)
    assert done["status"] == "completed"
    assert done["lastUpdatedAt"] > seen[-1]["lastUpdatedAt"]
    assert tasks.get(task_id)["lastUpdatedAt"] == done["lastUpdatedAt"]  # nothing changed


def test_a_task_first_read_when_complete_says_when_it_completed(home: Home) -> None:
    """Nobody looked while the turn ran: the first tasks/get, long after, gives the time the
    conversation settled (its state's last write), not the time of the look."""
    conv = _conv(home)
    tasks = Tasks(Faces(settings_for(home)))
    task_id = tasks.create(conv.id, 0, "conversation_start")["taskId"]
    with open_writer(conv) as w:
        w.append_block("CLAUDE", "OLLAMA", "hello?", msg_id="m1")
        r = w.reply("OLLAMA", "CLAUDE", "r1")
        r.content("hello!")
        r.finish()
        w.set_status(Status.IDLE)
    settled_at = conv.state.stat().st_mtime
    time.sleep(1.1)
    done = tasks.get(task_id)
    assert done["status"] == "completed"
    looked = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    assert done["lastUpdatedAt"] < looked
    assert done["lastUpdatedAt"][:19] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(settled_at))
