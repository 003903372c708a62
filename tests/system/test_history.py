"""History that fits the window, and the reasoning budget guard, end to end through the pipeline.

The scripted Ollama-wire fake records every request, so each test asserts what the model was
sent: old tool outputs stubbed first, then one summary call whose answer is written into the
log and reused, dropping only when that call fails, and one continuation with thinking off
for a reply that spent all its tokens thinking. The last test does it with real llama.cpp.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contemplation.engine.runtime import Runtime
from contemplation.models import BlockKind, MarkerKind, Status
from contemplation.prompt import budget, summarise
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, read_state
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from tests import realpeers
from tests.conftest import run_burst
from tests.fakes.ollama_server import FakeOllama, Step

WINDOW = 2048  # num_ctx of these conversations: 512 tokens reserved for the reply
# the system prompt, fixed (~220 tokens) so that what fits does not move with the default one
SYSTEM = """\
You are in an asynchronous conversation with {agent} (an AI agent or a person), about: {topic}.
Answer thoughtfully and concisely. When you need context that you do not have, write a line
that starts with "NEED: " followed by what you need, one per line, and stop; the answers come
back in blocks that start with "RESPONSE TO NEED:". You can ask for:
  NEED: Brain memory about <topic>
  NEED: Obsidian notes matching <query>
  NEED: File contents of <path>
  NEED: Search results for <query>
  NEED: Current state of <thing>
When the conversation has reached its goal and nothing more is needed, end your reply with a
line that says exactly:
=== COMPLETE ==="""


def make(home: Home, model: str = "gemma", backend: str = "ollama", **meta: Any) -> Conv:
    conv = new_conversation(
        home, "history", template=load_template(home, "default"), model=model, backend=backend
    )
    data = json.loads(conv.metadata.read_text())
    data["options"] = {"num_ctx": WINDOW, **meta.pop("options", {})}
    data.update(system_prompt=SYSTEM, prompt_mode="replace")
    data.update(meta)
    conv.metadata.write_text(json.dumps(data))
    return conv


def notes_of(conv: Conv) -> list[str]:
    return [
        t for b in parse(conv.log.read_bytes()).blocks for k, t in b.markers if k is MarkerKind.NOTE
    ]


def sent(fake: FakeOllama, i: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = fake.chat_requests()[i]["messages"]
    return messages


def turn_with(rt: Runtime, conv: Conv, fake: FakeOllama, text: str, *steps: Step) -> None:
    drop_message(conv, text)
    fake.enqueue(*steps)
    run_burst(rt)
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE, st


def q(i: int) -> str:
    return f"question {i}: " + "Tell me more about the migration plan. " * 35  # ~1,400 chars


def a(i: int) -> str:
    return f"answer {i}: " + "The plan moves one table at a time. " * 22  # ~800 chars


# --------------------------------------------------------------------------- 1. eviction


def test_an_old_tool_output_becomes_a_stub_before_anything_is_summarised_or_dropped(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    notes_dir = tmp_path / "notes"
    notes_dir.mkdir()
    big = notes_dir / "plan.md"
    big.write_text("step: copy the rows, check the counts\n" * 45)  # ~1,700 chars
    rt = Runtime(
        settings=make_settings(fake_ollama, tools={"allowed_roots": [str(notes_dir)]}), home=home
    )
    conv = make(home)
    need = f"File contents of {big}"
    turn_with(
        rt,
        conv,
        fake_ollama,
        "Read the plan.",
        Step(text=f"Let me look.\nNEED: {need}"),
        Step(text="It copies rows."),
    )
    # the tool output was the newest thing the model read: sent whole
    assert "copy the rows" in sent(fake_ollama, 1)[-1]["content"]
    turn_with(
        rt,
        conv,
        fake_ollama,
        "And then? " + "Say more about it. " * 190,
        Step(text="Then it checks."),
    )
    requests = fake_ollama.chat_requests()
    assert len(requests) == 3  # no summary call
    third = sent(fake_ollama, 2)
    assert [m["role"] for m in third] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    response = third[3]["content"]
    assert response.startswith(f"RESPONSE TO NEED: {need}\n(source: files.read, ")
    assert "copy the rows" not in response
    assert f"ask again with the same line: NEED: {need})" in response
    assert third[1:3] == sent(fake_ollama, 1)[1:3] and third[-1]["content"].startswith("And then?")
    assert notes_of(conv) == [
        f"1 old tool output(s) were replaced by a one-line stub to fit the model's context window ({WINDOW} tokens); the model can ask for them again"
    ]
    assert conv.log.read_text().count("copy the rows") == 45  # the log itself keeps it all


# --------------------------------------------------------------------------- 2. summary


def _long_history(rt: Runtime, conv: Conv, fake: FakeOllama) -> None:
    for i in range(2):
        turn_with(rt, conv, fake, q(i), Step(text=a(i)))
    assert len(fake.chat_requests()) == 2 and notes_of(conv) == []


def test_the_oldest_turns_are_summarised_once_written_to_the_log_and_reused(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    _long_history(rt, conv, fake_ollama)
    summary = (
        "The agent asked about the migration plan; the model said it moves one table at a time."
    )
    turn_with(rt, conv, fake_ollama, q(2), Step(text=summary), Step(text="Reply three."))
    summary_call, third = fake_ollama.chat_requests()[2:]
    # the summary call: the conversation's own prompt up to the oldest turn (what the server
    # holds in its cache), one instruction, no thinking, a bounded reply
    roles = [m["role"] for m in summary_call["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    # fitted at once to the low-water mark: both older turns go into the summary
    assert [m["content"] for m in summary_call["messages"][1:5]] == [q(0), a(0), q(1), a(1)]
    ask = summary_call["messages"][-1]["content"]
    words = budget.summary_words(WINDOW)  # a summary gets a tenth of the window
    assert ask.startswith(f"Summarise the conversation above in at most {words} words")
    bound = budget.summary_tokens(WINDOW)
    assert summary_call["options"] == {"num_ctx": WINDOW, "num_predict": bound}
    assert "think" not in summary_call and "tools" not in summary_call
    # the turn: the summary in front (in the system message), then the newest turns whole
    system = third["messages"][0]["content"]
    assert system.endswith(f"{budget.SUMMARY_PREFIX}\n{summary}")
    assert [m["content"] for m in third["messages"][1:]] == [q(2)]
    # the log holds it: visible to tail -f, read back by the parser
    log = conv.log.read_text()
    head = f"=== NOTE: summary of the log before the last 1 block(s) (4 message(s) summarised to fit the model's context window ({WINDOW} tokens)): {summary} ==="
    assert head in log and log.index(head) < log.index("Reply three.")
    parsed = parse(conv.log.read_bytes())
    assert budget.read_summary(parsed.blocks) == budget.Saved(summary, covers=4)
    assert [b.kind for b in parsed.blocks] == [BlockKind.AGENT, BlockKind.MODEL] * 3
    # the next turn reuses it: one request, the same summary, nothing summarised again
    turn_with(rt, conv, fake_ollama, "Short follow-up.", Step(text="Reply four."))
    assert len(fake_ollama.chat_requests()) == 5
    fourth = sent(fake_ollama, 4)
    assert fourth[0]["content"] == system
    assert [m["content"] for m in fourth[1:]] == [q(2), "Reply three.", "Short follow-up."]
    assert notes_of(conv)[-1] == (
        f"4 earlier message(s) were left out to fit the model's context window ({WINDOW} tokens); the summary above stands in for them"
    )
    assert sum(n.startswith("summary of the log") for n in notes_of(conv)) == 1


def test_a_turn_that_summarises_makes_nothing_durable_on_the_loop(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The NOTEs a summarising turn writes before its reply (the summary, what was left out)
    are made durable by the committer, like the turn's other writes: every fsync of the turn
    runs off the event loop, where one would hold every conversation. (The agent's drop
    fsyncs too, outside the loop.)"""
    rt = Runtime(settings=make_settings(fake_ollama, durability="fsync"), home=home)
    conv = make(home)
    _long_history(rt, conv, fake_ollama)
    real_fsync = os.fsync
    on_loop: list[int] = []

    def fsync(fd: int) -> None:
        if asyncio._get_running_loop() is not None:  # on the loop's thread, while it runs
            on_loop.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    turn_with(rt, conv, fake_ollama, q(2), Step(text="The summary."), Step(text="Reply three."))
    assert sum(n.startswith("summary of the log") for n in notes_of(conv)) == 1
    assert on_loop == []


# --------------------------------------------------------------------------- 3. fallback


def test_a_failed_summary_call_falls_back_to_leaving_the_oldest_turns_out(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    _long_history(rt, conv, fake_ollama)
    turn_with(
        rt,
        conv,
        fake_ollama,
        q(2),
        Step(kind="error", status=500, error="out of memory"),
        Step(text="Reply three."),
    )
    third = sent(fake_ollama, 3)
    assert budget.SUMMARY_PREFIX not in third[0]["content"]
    assert [m["content"] for m in third[1:]] == [q(2)]
    assert notes_of(conv) == [
        f"summarising 4 earlier message(s) failed (Ollama answered 500: out of memory); 4 message(s) were left out to fit the model's context window ({WINDOW} tokens)"
    ]
    assert budget.read_summary(parse(conv.log.read_bytes()).blocks) is None
    st = read_state(conv)
    assert st is not None and st.last_error is None and st.turns == 3  # the turn itself is fine


def test_a_summary_call_that_hangs_is_given_up_after_its_timeout(
    home: Home,
    fake_ollama: FakeOllama,
    make_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(summarise, "SUMMARY_TIMEOUT", 0.5)
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    _long_history(rt, conv, fake_ollama)
    turn_with(
        rt,
        conv,
        fake_ollama,
        q(2),
        Step(kind="hang", text="partial summary words"),
        Step(text="Reply three."),
    )
    assert len(fake_ollama.chat_requests()) == 4
    assert [m["content"] for m in sent(fake_ollama, 3)[1:]] == [q(2)]
    assert notes_of(conv)[0].startswith(
        "summarising 4 earlier message(s) failed (no answer within 0.5 s);"
    )
    assert "partial summary" not in conv.log.read_text()  # half a summary is no summary


def test_the_agent_cancelling_during_the_summary_call_cancels_the_turn(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home)
    _long_history(rt, conv, fake_ollama)
    drop_message(conv, q(2))
    # a summary that drips: the agent cancels once the summary call is on its way
    fake_ollama.enqueue(Step(text="one two three four five six", chunks=6, chunk_delay=0.3))

    def cancel_when_summarising() -> None:
        deadline = time.monotonic() + 30
        while len(fake_ollama.chat_requests()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        (conv.dir / ".cancel").touch()

    canceller = threading.Thread(target=cancel_when_summarising)
    canceller.start()
    run_burst(rt)
    canceller.join()
    st = read_state(conv)
    assert st is not None and st.status is Status.CANCELLED, st
    assert len(fake_ollama.chat_requests()) == 3  # no reply was asked for after the cancel
    last = parse(conv.log.read_bytes()).blocks[-1]
    assert last.kind is BlockKind.AGENT and last.text.strip() == q(2).strip()
    assert last.markers == ((MarkerKind.CANCELLED, "the turn was cancelled by the agent"),)
    assert notes_of(conv) == []  # no summary NOTE, no half reply
    assert budget.read_summary(parse(conv.log.read_bytes()).blocks) is None
    assert not (conv.dir / ".cancel").exists()  # honoured once


# --------------------------------------------------------------------------- guard


def test_a_reply_that_spent_every_token_thinking_gets_one_continuation_without_thinking(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    conv = make(home, model="qwen3", think=True, options={"num_predict": 64})
    thought = "Let me weigh every option. Then weigh them again."
    drop_message(conv, "What is 2 + 2?")
    fake_ollama.enqueue(
        Step(thinking=thought, no_content=True, done_reason="length", eval_count=64),
        Step(text="4."),
    )
    run_burst(rt)
    first, second = fake_ollama.chat_requests()
    assert first["think"] is True and second["think"] is False
    assert first["messages"] == second["messages"] and second["options"]["num_predict"] == 64
    note = "the model spent all 64 tokens of this reply thinking and wrote no answer; asked once more with thinking off"
    assert (
        f"=== THINKING ===\n{thought}\n=== END THINKING ===\n=== NOTE: {note} ===\n4.\n"
        in conv.log.read_text()
    )
    (_, reply) = parse(conv.log.read_bytes()).blocks
    assert (reply.text, reply.thinking.strip()) == ("4.", thought)
    assert reply.markers == (
        (MarkerKind.THINKING, ""),
        (MarkerKind.END_THINKING, ""),
        (MarkerKind.NOTE, note),
    )
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.turns == 1
    assert st.last_turn is not None and st.last_turn.done_reason == "stop"  # the continuation's


def test_the_guard_leaves_alone_a_cut_answer_and_a_reply_already_without_thinking(
    home: Home, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rt = Runtime(settings=make_settings(fake_ollama), home=home)
    thinking = make(home, model="qwen3", think=True)
    drop_message(thinking, "Go on.")
    fake_ollama.enqueue(Step(thinking="hmm", text="A cut answ", done_reason="length"))
    run_burst(rt)
    plain = make(home, model="qwen3", think=False)
    drop_message(plain, "Go on.")
    fake_ollama.enqueue(Step(no_content=True, done_reason="length"))
    run_burst(rt)
    assert len(fake_ollama.chat_requests()) == 2  # no continuation for either
    # no note of the guard's: only the length stop's own (a cut reply is said)
    for conv in (thinking, plain):
        [note] = notes_of(conv)
        assert note.startswith("stopped at the token limit"), note
    assert parse(thinking.log.read_bytes()).blocks[-1].text == "A cut answ"


# --------------------------------------------------------------------------- real llama.cpp


@pytest.mark.real
def test_real_llama_cpp_summarises_a_history_too_big_for_a_small_window_and_reuses_it(
    home: Home, make_settings: Callable[..., Settings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SmolLM2 behind llama-server writes the summary itself; a 1,024-token window (num_ctx)
    is what the history must fit, whatever the server's own context. (Short replies and a
    64-token summary keep it quick on a shared CPU.)"""
    monkeypatch.setattr(budget, "SUMMARY_MAX_TOKENS", 64)
    llama = realpeers.shared_llama_server()
    rt = Runtime(settings=make_settings(openai={"base_url": llama.url}), home=home)
    options = {"num_ctx": 1024, "num_predict": 16, "temperature": 0}
    conv = make(home, model="smollm2", backend="openai", options=options)
    topics = ["the database migration", "the backup schedule", "the release checklist"]
    for t in topics:
        drop_message(conv, f"Tell me about {t}. " + f"We need to understand {t} in detail. " * 25)
        run_burst(rt)
    parsed = parse(conv.log.read_bytes())
    saved = budget.read_summary(parsed.blocks)
    assert saved is not None and saved.text, conv.log.read_text()
    assert 0 < saved.covers < len(parsed.blocks)
    summaries = [n for n in notes_of(conv) if n.startswith("summary of the log before the last")]
    assert len(summaries) == 1
    assert [b.kind for b in parsed.blocks] == [BlockKind.AGENT, BlockKind.MODEL] * 3
    assert all(b.text.strip() for b in parsed.blocks)  # every turn got a real reply
    drop_message(conv, "Thanks.")
    run_burst(rt)
    after = notes_of(conv)
    assert [n for n in after if n.startswith("summary of the log before the last")] == summaries
    # num_predict 16 cuts each reply: its length stop's NOTE follows the summary's
    fits = [n for n in after if not n.startswith("stopped at the token limit")]
    assert fits[-1].endswith("the summary above stands in for them")
    st = read_state(conv)
    assert st is not None and st.status is Status.IDLE and st.turns == 4
