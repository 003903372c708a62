"""A fallback chain over real sockets: a dead primary is passed over while it rests, so the
turns after the first do not wait for it (review: each paid its connect timeout again)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from contemplation import backends
from contemplation.engine.pipeline import Runtime
from contemplation.models import ChatMessage, ChatRequest
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import realpeers
from tests.conftest import run_burst
from tests.fakes.openai_server import FakeOpenAI, Step

CONNECT = 3.0  # the dead primary's connect timeout


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def silent() -> Iterator[str]:
    """A host that never answers a connect (as one that is off the network): a listener whose
    backlog is full, so the kernel drops each new SYN and a client waits out its timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    filling = []
    for _ in range(4):  # more than the backlog holds
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        filling.append(s)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for s in filling:
            s.close()
        listener.close()


def test_a_silent_primary_costs_its_connect_timeout_once_not_every_turn(
    fake: FakeOpenAI, silent: str, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(
        fallback=["ollama", "openai"],
        ollama={"host": silent, "timeouts": {"connect": CONNECT}},
        openai={"base_url": fake.url},
    )
    req = ChatRequest("m", (ChatMessage("user", "hi"),), conversation_id="c")

    async def two_turns() -> list[float]:
        chain = backends.build("ollama", settings)
        took = []
        try:
            for _ in range(2):
                t0 = time.monotonic()
                events = [ev async for ev in chain.stream(req)]
                took.append(time.monotonic() - t0)
                assert events[0].kind == "note" and "this reply comes from openai" in events[0].text
        finally:
            await chain.aclose()
        return took

    first, second = asyncio.run(two_turns())
    assert len(fake.chat_requests()) == 2
    assert first >= CONNECT * 0.9, first  # the first turn found it dead the slow way
    assert second < CONNECT / 2, second  # the second did not wait for it again


def test_through_the_pipeline_the_second_turn_says_the_closed_port_was_passed_over(
    fake: FakeOpenAI, home: Home, make_settings: Callable[..., Settings]
) -> None:
    down = f"http://127.0.0.1:{realpeers.free_port()}"  # a real closed port
    settings = make_settings(
        fallback=["ollama", "openai"], ollama={"host": down}, openai={"base_url": fake.url}
    )
    conv = new_conversation(
        home, "fallback", template=load_template(home, "default"), model="m", backend="ollama"
    )
    rt = Runtime(settings=settings, home=home)
    for question in ("Why?", "And then?"):
        drop_message(conv, question)
        fake.enqueue(Step(pieces=["Because."]))
        run_burst(rt)
    notes = re.findall(r"^=== NOTE: (ollama .*) ===$", conv.log.read_text(), re.MULTILINE)
    assert len(notes) == 2, notes
    assert all(n.startswith(f"ollama unreachable (cannot reach {down}") for n in notes), notes
    assert "; passed over, tried again in " in notes[1], notes
    assert notes[1].endswith("this reply comes from openai"), notes
    assert len(fake.chat_requests()) == 2
