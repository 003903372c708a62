"""When the server's tokenizer is asked, what it is given, and the NOTE written once per
conversation and model."""

from __future__ import annotations

from contemplation.models import ChatMessage, ChatRequest, MarkerKind
from contemplation.prompt import budget, tokencount
from contemplation.protocol import logformat
from contemplation.protocol.parser import parse


def log_with(*notes: str) -> bytes:
    text = logformat.header("CLAUDE", "OLLAMA", "2026-11-26 03:00:00") + "Read this table.\n"
    text += "".join(logformat.marker(MarkerKind.NOTE, n) for n in notes)
    return text.encode()


def test_the_calibration_note_is_written_once_per_conversation_and_model() -> None:
    note = tokencount.note("smollm2", counted=2079, chars=2300, estimated=0.25, ratio=0.9)
    assert not tokencount.noted(parse(log_with()).blocks, "smollm2")
    written = parse(log_with("an unrelated note", note)).blocks  # as the log reads it back
    assert tokencount.noted(written, "smollm2")  # the next turn (or daemon) says it no more
    assert not tokencount.noted(written, "qwen3")  # another model: its own NOTE, once
    assert not tokencount.noted(written, "smollm")  # the name, not a prefix of it


def test_a_count_is_due_near_the_window_and_only_for_a_model_no_server_has_counted() -> None:
    assert tokencount.due(500, 2048, measured=False)  # a fifth: four times off would overflow
    assert not tokencount.due(300, 2048, measured=False)
    assert not tokencount.due(5000, 2048, measured=True)  # the server's count is known
    assert not tokencount.due(500, 0, measured=False)


def test_a_long_text_is_sampled_evenly_within_the_cap() -> None:
    text = "a" * 1000 + "9" * 1000
    assert tokencount.sample(text, cap=5000) == text
    got = tokencount.sample(text, cap=400, slices=4)
    assert len(got) == 400 and got.startswith("a" * 100) and got.endswith("9" * 100)
    assert got.count("9") == 200  # half of it from each half of the text


def test_the_text_counted_is_what_the_estimate_counts() -> None:
    req = ChatRequest(
        model="m",
        messages=(ChatMessage("system", "be brief"), ChatMessage("user", "12345")),
        tools=({"name": "grep"},),
    )
    text = tokencount.request_text(req)
    assert "be brief" in text and "12345" in text and "grep" in text


def test_the_servers_count_sets_the_ratio_at_once_and_marks_the_model_measured() -> None:
    cal = budget.Calibration()
    assert not cal.measured("m") and cal.ratio("m") == budget.DEFAULT_RATIO
    assert cal.counted("m", chars=1000, tokens=1430) == 1.43  # CJK: above observe's 1.2 cap
    assert cal.measured("m") and cal.ratio("m") == 1.43
    assert cal.counted("m", chars=0, tokens=5) == 1.43  # nothing counted: unchanged
