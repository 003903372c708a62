"""The ledger counts every request a conversation causes: a compaction's summary call is a
row of its own (cause ``compaction``, no turn of its own), so that the ledger's figures are
the server's. Before, over 18 turns past a 1,024-token window on a real llama-server, the
server computed 10,918 prompt tokens for the conversation and the ledger said 9,235: the two
summary calls (1,683 tokens, 15 %) were missing."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx
import pytest

from contemplation.engine.runtime import Runtime
from contemplation.models import Ledger, Usage
from contemplation.protocol import ledger
from contemplation.settings import Settings
from contemplation.store.layout import Home, read_metadata, read_state
from contemplation.writer import drop_message, write_metadata
from tests import realpeers
from tests.conftest import run_burst
from tests.system.test_slot_affinity import _conversation

TOPICS = (
    "how a folder of files can work as a message queue between two programs",
    "why a log file is rotated and how a reader notices it",
    "what fsync promises about a renamed file after a power cut",
    "how a daemon finds the messages it had claimed when it crashed",
    "why a cache of prompts helps a local language model answer faster",
)  # the fifth turn compacts the first four


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(rf"^llamacpp:{name}\s+(\S+)$", text, re.M)
    assert m is not None, name
    return float(m.group(1))


def test_a_summary_calls_usage_is_a_row_of_its_own_that_counts_no_turn() -> None:
    kept = Ledger()
    ledger.record(kept, ledger.entry(Usage(prompt_eval_count=900, cached_tokens=800,
                                           computed_tokens=100, eval_count=60),
                                     turn=3, provider="p", model="m", turns=0,
                                     miss="compaction"))  # fmt: skip
    ledger.record(kept, ledger.entry(Usage(prompt_eval_count=300, cached_tokens=0,
                                           computed_tokens=300, eval_count=20),
                                     turn=3, provider="p", model="m"))  # fmt: skip
    total = ledger.total(kept)
    assert total.turns == 1 and total.sent == 1200 and total.recomputed == 400
    assert [(t.turns, t.miss) for t in kept.turns] == [(0, "compaction"), (1, None)]


@pytest.mark.real
def test_a_real_llama_server_computed_what_the_ledger_says_compactions_included(
    home: Home, make_settings: Callable[..., Settings]
) -> None:
    server = realpeers.shared_llama_server(n_ctx=4096)  # its counters read as differences
    rt = Runtime(settings=make_settings(openai={"base_url": server.url}), home=home)
    conv = _conversation(home, "Ledger past the window")
    meta = read_metadata(conv)
    assert meta is not None
    options = {"temperature": 0, "num_predict": 40, "num_ctx": 1024}
    write_metadata(conv, meta.model_copy(update={"options": options}))
    before = (
        _metric(server.url, "prompt_tokens_total"),
        _metric(server.url, "tokens_predicted_total"),
    )
    for i, topic in enumerate(TOPICS):
        drop_message(conv, f"Question {i}: explain in detail {topic}. " + "Be thorough. " * 20)
        run_burst(rt)
        st = read_state(conv)
        assert st is not None and st.turns == i + 1, st
    prefilled = _metric(server.url, "prompt_tokens_total") - before[0]
    predicted = _metric(server.url, "tokens_predicted_total") - before[1]
    st = read_state(conv)
    assert st is not None
    rows = st.ledger.turns
    summaries = [r for r in rows if r.miss == "compaction" and r.turns == 0]
    assert summaries, [(r.turn, r.turns, r.miss, r.sent) for r in rows]  # it compacted
    total = ledger.total(st.ledger)
    assert total.turns == len(TOPICS)  # a summary call is no turn
    assert total.recomputed == pytest.approx(prefilled, rel=0.01), (total, prefilled)
    assert total.output == pytest.approx(predicted, rel=0.01), (total, predicted)
    print(
        f"\n{len(summaries)} summary calls; ledger recomputed {total.recomputed} vs server "
        f"{prefilled:.0f}; output {total.output} vs {predicted:.0f}"
    )
