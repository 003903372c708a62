"""Compaction at the floor of the server's cache. A real llama-server, one slot of 1,024 tokens, a
dialogue of 9 turns of about 150 new tokens each (a long question and a reply of 24 tokens:
generated tokens are the test's time, so the window fills on few of them; 18 turns of ~50 took
twice as long): every summary call extends the prompt the slot holds (the conversation's last
request, the instruction appended), so it reuses most of its prompt; the turn after it reuses at
least the system prompt; and the whole dialogue recomputes at most 1.6 times the new text a
turn. Before, compaction started at the window's edge, the summary form that extends the cache
did not fit, and the transcript that replaced it threw the slot's cache away (cache_n 5, system
prompt included). Token counts are the server's own (``timings.cache_n``/``prompt_n``): load
does not move them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from contemplation.engine.runtime import Runtime
from contemplation.prompt import budget
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_metadata, read_state
from contemplation.store.logview import LogView
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation, write_metadata
from tests import peers
from tests.conftest import run_burst
from tests.realpeers import LlamaServer
from tests.system.test_slot_affinity import Recorder

TURNS = 9
ASK = (
    "My notes so far: the queue is a folder of plain text files, one per message; a writer "
    "makes each file under a temporary name, flushes it, syncs it and renames it into place; "
    "a reader claims a file by renaming it into its own folder before it reads it; a crash "
    "leaves either the old name or the new one, never half a file; the disk is shared with "
    "a database that writes all day. Give one more short idea about keeping a queue of text "
    "files safe on a busy disk. ({i})"
)


@pytest.fixture
def small_slot() -> Iterator[Recorder]:
    """One slot of 1,024 tokens, behind a recorder of each request and its timings."""
    server = LlamaServer(peers.smollm2_gguf(), n_ctx=1024, n_parallel=1).start()
    recorder = Recorder(server.url)
    try:
        yield recorder
    finally:
        recorder.stop()
        server.stop()


def _conversation(home: Home) -> Conv:
    conv = new_conversation(
        home, "A long dialogue", template=load_template(home, "default"), model="smollm2",
        backend="openai",
    )  # fmt: skip
    meta = read_metadata(conv)
    assert meta is not None
    options = {"temperature": 0, "num_predict": 24, "num_ctx": 1024}
    write_metadata(conv, meta.model_copy(update={"options": options}))
    return conv


def _tokens(url: str, text: str) -> int:
    r = httpx.post(f"{url}/tokenize", json={"content": text}, timeout=30)
    return len(r.json()["tokens"])


def _is_summary_call(body: dict[str, Any]) -> bool:
    return str(body["messages"][-1]["content"]).startswith("Summarise")


@pytest.mark.real
def test_compaction_in_a_small_slot_extends_the_cache_instead_of_replacing_it(
    home: Home, small_slot: Recorder, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(openai={"base_url": small_slot.url}), home=home)
    conv = _conversation(home)
    new = 0
    reply = ""
    for i in range(TURNS):
        drop_message(conv, ASK.format(i=i))
        run_burst(rt)
        new += _tokens(small_slot.url, ASK.format(i=i)) + _tokens(small_slot.url, reply) + 10
        reply = LogView(conv, "agent").refresh().blocks[-1].text
    chats = small_slot.chats
    seen = [(_is_summary_call(b), t.get("cache_n"), t.get("prompt_n")) for b, t in chats]
    summaries = [j for j, (b, _) in enumerate(chats) if _is_summary_call(b)]
    recomputed = sum(t.get("prompt_n", 0) for _, t in chats)
    print(  # (what the bench prints too)
        f"\nFLOOR: {len(summaries)} summaries, reused of their prompt "
        f"{[seen[j][1:] for j in summaries]}, the turn after "
        f"{[seen[j + 1][1:] for j in summaries if j + 1 < len(seen)]}; recomputed {recomputed} "
        f"for {new} new: {recomputed / new:.2f}x"
    )
    assert len(summaries) >= 2, seen  # 9 turns of ~150 tokens overflow 1,024 twice
    for j in summaries:
        timings = chats[j][1]
        whole = timings["cache_n"] + timings["prompt_n"]
        assert timings["cache_n"] >= 0.8 * whole, (j, seen)  # it extends the slot's prompt
        after, after_t = chats[j + 1]
        system = str(after["messages"][0]["content"]).split(budget.SUMMARY_PREFIX)[0]
        assert after_t["cache_n"] >= 0.9 * _tokens(small_slot.url, system), (j, seen)
    assert recomputed <= 1.6 * new, (recomputed, new, seen)
    # the ledger names each miss: the first turn's, and each compaction's turn
    st = read_state(conv)
    assert st is not None
    misses = [t.miss for t in st.ledger.turns if t.turns]  # the turns' rows
    assert misses[0] == "new conversation", misses
    assert misses.count("compaction") == len(summaries), misses
    assert set(misses[1:]) <= {None, "compaction"}, misses
    # and each summary call is a row of its own, counted as no turn
    calls = [t for t in st.ledger.turns if not t.turns]
    assert len(calls) == len(summaries) and {t.miss for t in calls} == {"compaction"}, calls
