"""What no summary can make fit is cut where the model is told so, never by the server:
a message larger than the window is cut in the middle with a line saying how
much was left out; the needs a limit block answers together are listed first and last."""

from __future__ import annotations

from contemplation.models import ChatMessage
from contemplation.prompt import budget, prompts
from contemplation.protocol.logformat import RESPONSE_PREFIX


def test_an_older_message_larger_than_the_window_is_cut_in_the_middle_and_said() -> None:
    flood = "\n".join(f"NEED: File contents of nothing-{i}.md" for i in range(20_000))
    msgs = [  # the newest turn: the agent's words, the flood, an answer (a native tool call's)
        ChatMessage("system", "sys"),
        ChatMessage("user", "ask for everything"),
        ChatMessage("assistant", flood),
        ChatMessage("tool", "the answer", tool_call_id="c1", tool_name="files.read"),
    ]
    kept, _, note = budget.fit(msgs, 8192, reserve=1024)
    assert budget.estimate(kept) <= 8192 - 1024
    assert kept[-1] == msgs[-1] and kept[0] == msgs[0]
    (cut,) = [m for m in kept if m.role == "assistant"]
    assert cut.content.startswith("NEED: File contents of nothing-0.md")
    assert cut.content.endswith("nothing-19999.md")
    assert "characters of this message left out to fit the model's context window" in cut.content
    assert "cut in the middle" in note and "still larger" not in note


def test_the_agents_newest_words_are_never_cut() -> None:
    msgs = [ChatMessage("system", "s"), ChatMessage("user", "x" * 40_000)]
    kept, _, note = budget.fit(msgs, 4096, reserve=512)
    assert kept == msgs and "still larger than the window" in note


def test_needs_answered_together_are_shown_first_and_last() -> None:
    needs = [f"{RESPONSE_PREFIX} File contents of nothing-{i}.md" for i in range(20_000)]
    text = "\n".join([*needs, "(source: limits, 2026-11-26 02:33:23)", "NOT ANSWERED (limited): x"])
    shown = prompts.condensed_needs(text).split("\n")
    assert shown[:5] == needs[:5] and shown[6:11] == needs[-5:]
    assert shown[5] == "[… 19990 more needs, answered together with these …]"
    assert shown[11:] == ["(source: limits, 2026-11-26 02:33:23)", "NOT ANSWERED (limited): x"]
    few = "\n".join([*needs[:11], "(source: files.read, t)"])
    assert prompts.condensed_needs(few) == few
