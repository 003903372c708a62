"""A conversation that comes back after another took its slot finds its
history again. On a server that keeps slot files (``--slot-save-path``) the daemon saves the
idle conversation's slot to a file of its own before another conversation takes the slot,
and restores it when the conversation returns; the next turn's ``cache_n`` says whether the
restore really held (llama.cpp #26676). Before, only a template's prefix was ever copied: a
returning conversation prefilled its whole history again. Real llama-server, one slot."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import Callable, Iterator

import pytest

from contemplation.backends.base import Check
from contemplation.engine.runtime import Runtime
from contemplation.settings import Settings
from contemplation.store.layout import Home, read_state
from contemplation.writer import drop_message, kvmap
from tests import peers, realpeers
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


@pytest.mark.real
def test_a_conversation_resumed_after_the_daemon_and_the_server_restarted_reuses_its_prompt(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    """Warm across restarts: the slot is saved in the background once the turn is over, the
    map of files is durable in the home, and the first turn after a daemon and a llama-server
    restart (same model, same --slot-save-path) has its file restored before it is sent.
    Before, that turn prefilled its whole prompt again (0 % reused)."""
    server = LlamaServer(peers.smollm2_gguf(), n_ctx=2048, n_parallel=1, slot_save=True).start()
    recorder = Recorder(server.url)
    try:
        conv = _conversation(home, "Warm across restarts")
        settings = make_settings(openai={"base_url": recorder.url})
        rt = Runtime(settings=settings, home=home)
        for i in range(2):
            drop_message(conv, f"In one short sentence, idea number {i}? " + "Context. " * 60)
            run_burst(rt)
        kept = kvmap.load(home.root, "openai")
        assert [e.conv for e in kept.entries] == [conv.id], kept  # saved after its turn
        assert stat.S_IMODE((home.root / kvmap.FILE).stat().st_mode) == 0o600

        async def doctor() -> list[Check]:
            try:
                return await rt.provider("openai").backend.check("smollm2")
            finally:
                await rt.aclose()

        line = next(c for c in asyncio.run(doctor()) if c.name == "slot files")
        assert line.detail.startswith("kept"), line
        server.stop()
        server.start()  # the same model and --slot-save-path: its cache is empty now
        rt = Runtime(settings=settings, home=home)  # the daemon restarted: nothing in memory
        drop_message(conv, "And in one more sentence, why?")
        run_burst(rt)
        timings = recorder.chats[-1][1]
        reused = timings["cache_n"] / (timings["cache_n"] + timings["prompt_n"])
        assert reused >= 0.9, timings
        st = read_state(conv)
        assert st is not None and st.turns == 3
        assert st.ledger.turns[-1].miss is None, st.ledger.turns[-1]
        assert rt.provider("openai").affinity.restores_failed == 0
        print(
            f"\nafter both restarts: {timings['cache_n']} of "
            f"{timings['cache_n'] + timings['prompt_n']} prompt tokens reused ({reused:.0%})"
        )
    finally:
        recorder.stop()
        server.stop()


@pytest.mark.real
def test_doctor_says_whether_the_server_keeps_slot_files_and_how_to_turn_it_on(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    plain = realpeers.shared_llama_server(n_ctx=4096)  # llama-server's default: no files
    rt = Runtime(settings=make_settings(openai={"base_url": plain.url}), home=home)

    async def checks() -> list[Check]:
        try:
            return await rt.provider("openai").backend.check("smollm2")
        finally:
            await rt.aclose()

    line = next(c for c in asyncio.run(checks()) if c.name == "slot files")
    assert line.detail.startswith("off") and "--slot-save-path" in " ".join(line.hints)
