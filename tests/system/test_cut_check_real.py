"""Measured: the check that calls a reply built on a cut prompt (its server counted
clearly fewer tokens than we sent) never fires on a real server that did not cut. A real
llama-server (xllamacpp's build, SmolLM2, 2,048-token slot, prompt cache on) holds three
dialogues on one model: prose, tables of digits (a token a digit), and one that goes from
prose to a table and back; each grows past the window and is compacted. Every turn's count
is the server's own (``usage.prompt_tokens``, ``timings.cache_n + prompt_n``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from contemplation.engine.pipeline import process_pending
from contemplation.engine.runtime import Runtime
from contemplation.models import MarkerKind, Status, Usage
from contemplation.prompt import truncation
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import realpeers

pytestmark = pytest.mark.real

WINDOW = 2048
TURNS = 7


@pytest.fixture(scope="module")
def llama() -> Iterator[realpeers.LlamaServer]:
    yield from realpeers.serving_smollm2(n_ctx=WINDOW, threads=1)


def digits(n: int, seed: int) -> str:
    return "".join(str((i * 7 + seed) % 10) for i in range(n))


PROSE = (
    "The migration moves one table at a time; each step is checked against the old copy "
    "before the next begins, and a failed check stops the run. "
)


def message(kind: str, i: int) -> str:
    if kind == "prose" or (kind == "mixed" and i % 3 != 1):
        return f"Part {i}: " + PROSE * (2 + i % 3)
    return f"Table {i}, read it back: " + digits(300 + 40 * i, i)


@pytest.mark.slow  # 141 s in the default tier's clean-clone run: a long dialogue, in --slow
@pytest.mark.timeout(600)  # 21 turns and their compactions on one shared CPU thread
def test_no_turn_of_a_real_llama_server_dialogue_is_called_cut(
    home: Home,
    llama: realpeers.LlamaServer,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[int, int]] = []  # (the server's count, ours) for every turn compared
    real_check = truncation.check

    def spy(counts: truncation.Counts, conv: str, usage: Usage, request: Any, r: float) -> str:
        counted = truncation.whole_count(usage)
        if counted is not None:
            seen.append((counted, truncation.sent_tokens(request, r, counts.last(conv))))
        return real_check(counts, conv, usage, request, r)

    monkeypatch.setattr(truncation, "check", spy)
    settings = make_settings(openai={"base_url": llama.url + "/v1"})
    rt = Runtime(settings=settings, home=home)
    convs: dict[str, Conv] = {}
    for kind in ("prose", "digits", "mixed"):
        conv = new_conversation(
            home, kind, template=load_template(home, "default"), model="smollm2", backend="openai"
        )
        meta = json.loads(conv.metadata.read_text())
        meta["options"] = {"temperature": 0, "num_predict": 16}
        conv.metadata.write_text(json.dumps(meta))
        convs[kind] = conv

    async def dialogue() -> None:  # one event loop for every turn, as in the daemon
        try:
            for i in range(TURNS):
                for kind, conv in convs.items():
                    drop_message(conv, message(kind, i))
                await process_pending(rt)
                for conv in convs.values():
                    st = read_state(conv)
                    assert st is not None and st.status is Status.IDLE and st.turns == i + 1, st
        finally:
            await rt.aclose()

    asyncio.run(dialogue())
    cuts = [
        (c.dir.name, t)
        for c in convs.values()
        for b in parse(c.log.read_bytes()).blocks
        for k, t in b.markers
        if k is MarkerKind.WARNING and t.startswith("the server counted")
    ]
    compacted = {
        kind: sum(
            t.startswith("summary of the log before")
            for b in parse(c.log.read_bytes()).blocks
            for k, t in b.markers
            if k is MarkerKind.NOTE
        )
        for kind, c in convs.items()
    }
    shares = sorted(round(counted / max(1, ours), 3) for counted, ours in seen)
    print(
        f"\nturns compared: {len(seen)}; called cut: {len(cuts)}; server/ours lowest: {shares[:5]}"
    )
    print(f"compactions: {compacted}")
    assert len(seen) == TURNS * len(convs)
    assert compacted["digits"] >= 1  # the turns after a compaction were compared too
    assert cuts == []
