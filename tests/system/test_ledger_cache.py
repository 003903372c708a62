"""The ledger knows every server's cache figure and names why it missed.
Ollama reports what it read from its cache since #17943 (2026-08-22: ``prompt_eval_cached_count``
beside ``prompt_eval_count``, which counts every prompt token, those cached included; left out
by an older server). Ollama is not installed here (see real-peers.md), so the scripted Ollama
sends that final chunk as Ollama's api.Metrics does (the field only when set). A turn whose
server recomputed what it held says why: a new conversation, its slot taken, a compaction..."""

from __future__ import annotations

from collections.abc import Callable

from contemplation.engine.runtime import Runtime
from contemplation.models import Usage
from contemplation.protocol import ledger
from contemplation.settings import Settings
from contemplation.store.layout import Home, read_state
from contemplation.writer import drop_message
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama, Step
from tests.system.test_ledger import make, run_cli


def test_ollamas_cached_count_is_the_ledgers_reuse_and_each_miss_is_named(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    fake_ollama.enqueue(
        Step(text="One.", prompt_eval_count=300, prompt_eval_cached_count=0, eval_count=2),
        Step(text="Two.", prompt_eval_count=330, prompt_eval_cached_count=300, eval_count=2),
        Step(text="Three.", prompt_eval_count=360, prompt_eval_cached_count=12, eval_count=2),
        Step(text="Four.", prompt_eval_count=390, eval_count=2),  # an older Ollama: no figure
    )
    for i in range(4):
        drop_message(conv, f"Question {i}?")
        run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.turns == 4
    seen = [(t.sent, t.reused, t.recomputed, t.miss) for t in st.ledger.turns]
    assert seen == [
        (300, 0, 300, "new conversation"),
        (330, 300, 30, None),  # it held the whole previous prompt
        (360, 12, 348, "slot taken"),  # it had lost it: another conversation took the slot
        (390, None, None, None),  # unknown, never 0, and no miss guessed
    ], seen
    total = ledger.total(st.ledger)
    assert (total.reused, total.recomputed) == (312, 678)
    out = run_cli(home, "ledger", conv.id)
    assert "turn 3 " in out and "cache missed: slot taken" in out, out
    assert "turn 1 " in out and "cache missed: new conversation" in out, out


def test_the_miss_causes_a_compaction_tools_a_cut_and_a_failed_restore() -> None:
    hit = Usage(prompt_eval_count=500, cached_tokens=40)
    assert ledger.miss(hit, held=450, extends=False, compacted=True) == "compaction"
    assert ledger.miss(hit, held=450, extends=False, same_tools=False) == "tools changed"
    assert ledger.miss(hit, held=450, extends=False, cut=True) == "cut"
    assert ledger.miss(hit, held=450, extends=False) == "history changed"
    assert ledger.miss(hit, held=450, extends=True, restore="failed") == "restore failed"
    assert ledger.miss(hit, held=450, extends=True) == "slot taken"
    assert ledger.miss(hit, held=45, extends=True) is None  # it reused what it held
    assert ledger.miss(hit, held=None, extends=False) is None  # after a restart: unknown
    assert ledger.miss(Usage(prompt_eval_count=500), held=450, extends=True) is None
