"""Honest repetition is kept, through a real turn (the daemon's turn against the scripted
Ollama, the loop watch on): an answer held to a schema that asks for 60 identical records
is delivered whole in one request; a repetition inside a schema's answer is bounded by the
reply cap, not stopped; ``continue`` of a reply stopped for repeating is not stopped again
for the same repetition, and a loop is still stopped without a schema."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from contemplation.faces import actions
from contemplation.models import BlockKind, MarkerKind, Status
from contemplation.protocol import structured
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, ensure_home, new_conversation
from tests.conftest import run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama, Step

RECORD = {"id": 0, "status": "pending", "owner": None, "tags": [], "score": 0.0}
SIXTY = {  # the finding's schema: exactly 60 records, each exactly this one
    "type": "array",
    "minItems": 60,
    "maxItems": 60,
    "items": {"const": RECORD},
}
LOOP = " and a data warehouse"


def make_conv(home: Home) -> Conv:
    ensure_home(home)
    return new_conversation(
        home, "records", template=load_template(home, "default"), model="llama3.2",
        backend="ollama",
    )  # fmt: skip


def model_blocks(conv: Conv) -> list[Any]:
    return [b for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.MODEL]


def stopped_for_repeating(block: Any) -> bool:
    return any(k is MarkerKind.NOTE and "repeating itself" in t for k, t in block.markers)


def test_sixty_identical_records_held_to_a_schema_are_delivered_whole(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, structured.with_schema("60 pending records, please.", SIXTY))
    answer = json.dumps([RECORD] * 60, indent=2)
    fake_ollama.default_step = Step(text=answer, chunks=400)
    run_burst(runtime_for(make_settings(fake_ollama, stop_repeating=True)))
    assert len(fake_ollama.chat_requests()) == 1  # no retry
    [block] = model_blocks(conv)
    assert block.text.strip() == answer
    assert not stopped_for_repeating(block), block.markers
    assert not any(k in (MarkerKind.ERROR, MarkerKind.INTERRUPTED) for k, _ in block.markers)
    st = read_state(conv)
    assert st is not None and st.status is not Status.ERROR and st.reply_cut is None


def test_a_schema_answer_is_bounded_by_the_reply_cap_not_by_repetition(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    """A repetition of words inside a schema's answer (a loop without one) is not stopped:
    the shape was asked for, and the reply cap bounds the answer."""
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    conv = make_conv(home)
    drop_message(conv, structured.with_schema("Say it 100 times.", schema))
    answer = json.dumps({"text": "In one sentence:" + LOOP * 100})
    fake_ollama.default_step = Step(text=answer, chunks=300)
    run_burst(runtime_for(make_settings(fake_ollama, stop_repeating=True)))
    [sent] = fake_ollama.chat_requests()
    assert sent["options"]["num_predict"] > 0  # the reply cap went with it
    [block] = model_blocks(conv)
    assert block.text.strip() == answer and not stopped_for_repeating(block)
    # the same words without a schema: a loop, stopped
    plain = make_conv(home)
    drop_message(plain, "Say it 100 times.")
    fake_ollama.default_step = Step(text="In one sentence:" + LOOP * 100, chunks=300)
    run_burst(runtime_for(make_settings(fake_ollama, stop_repeating=True)))
    [cut] = model_blocks(plain)
    assert stopped_for_repeating(cut) and len(cut.text) < len(LOOP) * 80


def test_continue_is_not_stopped_again_for_the_same_repetition(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv = make_conv(home)
    drop_message(conv, "Write the phrase over and over.")
    settings = make_settings(fake_ollama, stop_repeating=True)
    fake_ollama.enqueue(Step(text="In one sentence:" + LOOP * 100, chunks=300))
    run_burst(runtime_for(settings))
    [first] = model_blocks(conv)
    assert stopped_for_repeating(first)
    said = first.text
    # the person reads it and asks for more of the same: the model goes on with it
    actions.go_on(settings, conv)
    more = LOOP * 100 + ". Done."
    fake_ollama.enqueue(Step(text=more, chunks=300))
    run_burst(runtime_for(settings))
    sent = fake_ollama.chat_requests()[-1]["messages"][-1]
    assert sent["role"] == "assistant" and sent["content"].startswith(said.strip()[:40])
    first, second = model_blocks(conv)
    assert second.text.strip() == more.strip() and not stopped_for_repeating(second)
    # another loop after it is still stopped
    actions.go_on(settings, conv)
    fake_ollama.enqueue(Step(text=" I hope this helps!" * 100, chunks=300))
    run_burst(runtime_for(settings))
    assert stopped_for_repeating(model_blocks(conv)[-1])
