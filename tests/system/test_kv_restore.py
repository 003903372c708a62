"""A conversation that comes back after another took its slot finds its
history again. On a server that keeps slot files (``--slot-save-path``) the daemon saves the
idle conversation's slot to a file of its own before another conversation takes the slot,
and restores it when the conversation returns; the next turn's ``cache_n`` says whether the
restore really held (llama.cpp #26676). Before, only a template's prefix was ever copied: a
returning conversation prefilled its whole history again. Real llama-server, one slot."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from contemplation.engine.runtime import Runtime
from contemplation.settings import Settings
from contemplation.store.layout import Home
from contemplation.writer import drop_message
from tests import peers
from tests.conftest import run_burst
from tests.realpeers import LlamaServer
from tests.system.test_slot_affinity import Recorder, _conversation


@pytest.fixture
def one_slot() -> Iterator[Recorder]:
    """One slot of 2,048 tokens that keeps slot files."""
    server = LlamaServer(peers.smollm2_gguf(), n_ctx=2048, n_parallel=1, slot_save=True).start()
    recorder = Recorder(server.url)
    try:
        yield recorder
    finally:
        recorder.stop()
        server.stop()


@pytest.mark.real
def test_a_conversation_back_after_another_took_its_slot_reuses_its_whole_history(
    home: Home, one_slot: Recorder, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(openai={"base_url": one_slot.url}), home=home)
    convs = [_conversation(home, t) for t in ("Folder queues", "Log rotation", "Crash safety")]
    for i in range(2):
        for conv in convs:
            drop_message(conv, f"In one short sentence, idea number {i}?")
            run_burst(rt)
    sent = one_slot.chats
    assert len(sent) == 6
    seen = [(t["cache_n"], t["prompt_n"]) for _, t in sent]
    for j in range(3, 6):  # each came back after two others had the one slot
        before, now = sent[j - 3][1], sent[j][1]
        whole = before["cache_n"] + before["prompt_n"]
        assert now["cache_n"] >= whole - 2, (j, seen)
    failed = rt.provider("openai").affinity.restores_failed
    assert failed == 0, failed
