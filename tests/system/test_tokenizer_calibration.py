"""The token estimate calibrated by the server's own tokenizer.

A real llama-server (xllamacpp's build) counts digits at about one token a character, four
times the default estimate. A daemon that has not yet heard the server count this model's
prompts (a restart) would send a history it believes fits and have it refused; with a
tokenizer at hand it counts the request's text once (``POST /tokenize``), fits the history to
that count, and the request it sends fits the first time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator

import pytest

from contemplation.backends.base import PhaseTimeouts
from contemplation.backends.openai import OpenAIBackend
from contemplation.engine.runtime import Runtime
from contemplation.models import MarkerKind, Status
from contemplation.prompt import budget, tokencount
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import realpeers
from tests.conftest import run_burst
from tests.fakes.openai_server import FakeOpenAI

pytestmark = pytest.mark.real

# llama-server's tokens per slot: a small window, because reading the prompts that fill it is
# what this test spends its time on (a single thread reads 30-70 tokens a second here)
WINDOW = 1024


@pytest.fixture(scope="module")
def llama() -> Iterator[realpeers.LlamaServer]:
    yield from realpeers.serving_smollm2(n_ctx=WINDOW, threads=1)


def notes_of(conv: Conv) -> list[str]:
    return [
        t for b in parse(conv.log.read_bytes()).blocks for k, t in b.markers if k is MarkerKind.NOTE
    ]


def digits(n: int) -> str:
    return ("1234567890" * (n // 10 + 1))[:n]


def test_a_restarted_daemon_counts_with_the_servers_tokenizer_and_sends_a_request_that_fits(
    home: Home, llama: realpeers.LlamaServer, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(openai={"base_url": llama.url + "/v1"})
    conv = new_conversation(
        home, "numbers", template=load_template(home, "default"), model="smollm2", backend="openai"
    )
    meta = json.loads(conv.metadata.read_text())
    # a short reply: what is answered does not matter, only the prompts' count
    meta["options"] = {"temperature": 0, "num_predict": 8}
    conv.metadata.write_text(json.dumps(meta))
    # by the server's count (~210 tokens of system prompt, a token a digit) two tables of 200
    # digits stay below where a turn compacts (~860 of the 1,024), and the 400 more of the
    # third message take the history well past it, and past the window
    for i in range(2):  # each turn fits the window, even by the server's count
        drop_message(conv, f"Table {i}, read it back: {digits(200)}")
        run_burst(Runtime(settings=settings, home=home))
        st = read_state(conv)
        assert st is not None and st.status is Status.IDLE and st.turns == i + 1, st
    # a daemon started again knows no ratio for smollm2: by the default estimate (a quarter
    # of a token a character) the history and this message fit; by the server's count not
    rt = Runtime(settings=settings, home=home)
    assert not rt.calibration.measured("smollm2")
    drop_message(conv, f"And this one: {digits(400)}")
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.turns == 3, st
    notes = notes_of(conv)
    assert not [n for n in notes if n.startswith("the server counted")], notes  # never refused
    calibrated = [n for n in notes if tokencount.is_calibration_note(n, "smollm2")]
    assert len(calibrated) == 1, notes
    assert any(n.startswith("summary of the log before") for n in notes), notes  # compacted
    assert rt.calibration.ratio("smollm2") > 2 * budget.DEFAULT_RATIO
    blocks = parse(conv.log.read_bytes()).blocks
    assert not [t for b in blocks for k, t in b.markers if k is MarkerKind.ERROR]
    assert blocks[-1].text.strip()  # answered


FAST = PhaseTimeouts(connect=2, first_byte=5, idle=5, total=30)


def count(url: str, text: str) -> int | None:
    async def go() -> int | None:
        backend = OpenAIBackend(url, timeouts=FAST)
        try:
            return await backend.count_tokens(text, within=5)
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_the_count_is_llama_servers_own_and_a_server_without_a_tokenizer_says_none(
    llama: realpeers.LlamaServer,
) -> None:
    assert count(llama.url + "/v1", digits(300)) == 300  # one token a digit, as it counts
    fake = FakeOpenAI().start()  # an OpenAI-compatible server with no /tokenize (404)
    try:
        assert count(fake.url + "/v1", digits(300)) is None
        assert [r["_path"] for r in fake.requests] == ["/tokenize"]  # at the root, once
    finally:
        fake.stop()
