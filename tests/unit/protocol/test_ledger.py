"""The ledger: a turn's line from the backend's usage alone, sums that keep an
unknown figure unknown, and a bounded state.json record."""

from __future__ import annotations

import time

from contemplation.backends.chat_completions import ChunkTurn
from contemplation.models import LEDGER_KEYS_KEPT, LEDGER_TURNS_KEPT, Ledger, Usage
from contemplation.protocol import ledger


def test_llama_server_timings_say_what_was_reused_and_recomputed() -> None:
    turn = ChunkTurn(t0=time.monotonic())
    turn.chunk({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    turn.chunk({
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 7},
        "timings": {"cache_n": 260, "prompt_n": 40, "prompt_ms": 12.5,
                    "predicted_n": 7, "predicted_ms": 30.0},
    })  # fmt: skip
    usage = turn.finish(None)[-1].usage
    assert usage is not None
    line = ledger.entry(usage, turn=1, provider="openai", model="smollm2")
    assert (line.sent, line.reused, line.recomputed, line.output) == (300, 260, 40, 7)
    assert (line.prefill_ms, line.generate_ms, line.load_ms) == (12.5, 30.0, None)


def test_openai_cached_tokens_give_the_recomputed_by_difference() -> None:
    turn = ChunkTurn(t0=time.monotonic())
    turn.chunk({"usage": {"prompt_tokens": 1000, "completion_tokens": 5,
                          "prompt_tokens_details": {"cached_tokens": 768}}})  # fmt: skip
    usage = turn.finish(None)[-1].usage
    assert usage is not None
    assert (usage.cached_tokens, usage.computed_tokens, usage.prompt_eval_count) == (768, 232, 1000)


def test_a_figure_no_server_said_stays_unknown_in_the_sums() -> None:
    book = Ledger()
    ollama = Usage(prompt_eval_count=100, eval_count=10, load_duration_ms=1.0)
    ledger.record(book, ledger.entry(ollama, turn=1, provider="ollama", model="m"))
    ledger.record(book, ledger.entry(None, turn=2, provider="ollama", model="m", context_bytes=9))
    total = ledger.total(book)
    assert (total.turns, total.sent, total.output, total.load_ms) == (2, 100, 10, 1.0)
    assert total.reused is None and total.recomputed is None and total.queued_ms is None
    assert total.context_bytes == 9
    assert "? reused" in ledger.line(total)


def test_the_record_is_bounded_but_the_sums_hold_every_turn() -> None:
    book = Ledger()
    n = LEDGER_TURNS_KEPT + 50
    for i in range(n):
        model = f"m{i % (LEDGER_KEYS_KEPT + 4)}"
        ledger.record(book, ledger.entry(Usage(eval_count=1), turn=i + 1, provider="p", model=model))
    assert len(book.turns) == LEDGER_TURNS_KEPT and book.turns[-1].turn == n
    assert len(book.by) == LEDGER_KEYS_KEPT + 1 and ledger.OTHER in book.by
    assert ledger.total(book).output == n



def test_opencode_reports_its_input_and_cache_read_as_its_fixture_shows() -> None:
    """The shape of OpenCode 1.18's prompt response (shared/reference/fixtures), with a cache
    read where the fixture's stub server had none."""
    from contemplation.backends.opencode import OpenCodeBackend

    tokens = {"total": 130, "input": 10, "output": 3, "reasoning": 0,
              "cache": {"write": 0, "read": 117}}  # fmt: skip
    data = {
        "info": {"role": "assistant", "tokens": tokens, "finish": "stop", "id": "msg_1"},
        "parts": [
            {"type": "step-start", "id": "prt_1"},
            {"type": "text", "text": "pong from stub ", "id": "prt_2"},
            {"type": "step-finish", "reason": "stop", "tokens": tokens, "id": "prt_3"},
        ],
    }
    events, _ = OpenCodeBackend("http://127.0.0.1:9")._events(data, time.monotonic(), "m")
    usage = events[-1].usage
    assert usage is not None
    line = ledger.entry(usage, turn=1, provider="opencode", model="m")
    # OpenCode's input leaves the cache read out (its total is input + output + cache)
    assert (line.sent, line.reused, line.recomputed, line.output) == (127, 117, 10, 3)


def test_the_line_says_the_same_of_a_sum_and_of_the_index_s_tenth() -> None:
    """The index keeps sums at a tenth (index/ledger.py); the line of state.json's sums must
    say what the line of the index's says: 0.51 ms was "1 ms" from one and "0 ms" from the
    other (0.5 rounds half to even), and `status` disagreed with `status CONV`."""
    for ms in (0.51, 0.45, 1.55, 2.5, 1234.56, 0.04):
        exact = {"turns": 1, **dict.fromkeys(ledger.FIELDS), "context_bytes": 0, "queued_ms": ms}
        tenth = {**exact, "queued_ms": round(ms, 1)}
        assert ledger.sums_line(exact) == ledger.sums_line(tenth), ms
