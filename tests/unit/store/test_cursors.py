"""Cursors that miss nothing: for any interleaving of the agent's messages, the
rules' answers, replies streamed in pieces and the agent's calls, an agent that follows the
cursors it is handed sees every block it did not write exactly once, in log order.

The writes go through the real writer (intents, commits) into a real folder; the calls are
the MCP faces' own ``check`` and the ``respond`` action, as an agent makes them."""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contemplation import settings as settings_mod
from contemplation.faces import actions
from contemplation.faces.mcp import calls as mcp_faces
from contemplation.faces.reading import own_block
from contemplation.protocol import paging
from contemplation.protocol.parser import parse
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import ReplyStream, new_conversation, open_writer
from tests.unit.examples import examples

OPS = st.lists(
    st.sampled_from(["message", "rule", "reply", "chunk", "long", "finish", "check", "respond"]),
    min_size=1,
    max_size=30,
)


class Agent:
    """The agent: holds the cursor it was last handed and what it has been shown."""

    def __init__(self, faces: mcp_faces.Faces, conv_id: str) -> None:
        self.faces = faces
        self.conv_id = conv_id
        self.cursor: int | None = 0  # conversation_start's cursor for a new conversation
        self.seen: list[tuple[int, str]] = []

    def check(self) -> None:
        """One call, with the smallest page: a long block comes in pieces, joined here."""
        got = self.faces.check(self.conv_id, self.cursor, max_bytes=paging.PAGE_FLOOR)
        for b in got["blocks"]:
            if b.get("continues"):
                offset, text = self.seen[-1]
                assert offset == b["offset"]
                self.seen[-1] = (offset, text + b["text"])
            else:
                self.seen.append((b["offset"], b["text"]))
        self.cursor = got["cursor"]

    def respond(self) -> None:
        conv = self.faces.reader.locate(self.conv_id)
        done = actions.respond(
            self.faces.settings, self.faces.reader, conv, "note", plain=True, since=self.cursor
        )
        self.cursor = done["cursor"]


@settings(
    max_examples=examples(60),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_following_the_cursors_yields_every_other_block_exactly_once(
    tmp_path_factory: Any, ops: list[str]
) -> None:
    home = Home(tmp_path_factory.mktemp("home"))
    s = settings_mod.load(home=home.root, env={}, config=None)
    conv = new_conversation(
        home, "cursors", template=load_template(home, "default"), model="m", backend="ollama"
    )
    agent = Agent(mcp_faces.Faces(s), conv.id)
    n = 0
    with contextlib.ExitStack() as streaming:
        reply: ReplyStream | None = None
        for op in ops:
            n += 1
            if op in {"check", "respond"}:
                agent.check() if op == "check" else agent.respond()
            elif reply is not None and op in {"chunk", "long", "finish"}:
                reply.content(f"piece {n} " if op != "long" else f"line {n}\n" * 600)
                if op == "finish":
                    reply.finish()
                    streaming.close()
                    reply = None
            elif reply is None and op == "reply":
                w = streaming.enter_context(open_writer(conv))
                reply = w.reply("OLLAMA", "CLAUDE", f"r{n}")
                reply.content(f"reply {n} ")
            elif reply is None and op in {"message", "rule"}:
                source = "agent" if op == "message" else "memory.search"
                body = (
                    f"message {n}"
                    if op == "message"
                    else f"RESPONSE TO NEED: x{n}\n(source: {source}, 2026-01-01 00:00:00)\nA{n}"
                )
                with open_writer(conv) as w:
                    w.append_block("CLAUDE", "OLLAMA", body, msg_id=f"m{n}")
        if reply is not None:
            reply.finish()
    for _ in range(1000):  # everything is whole now: the last looks, page by page
        before = agent.cursor
        agent.check()
        if agent.cursor == before:
            break
    blocks = parse(conv.log.read_bytes()).blocks
    theirs = [(b.offset, b.text) for b in blocks if not own_block(b)]
    assert agent.seen == theirs
