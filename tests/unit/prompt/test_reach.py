"""A turn reads a long log's history back only as far as the window and the summary call can
reach: what it plans from the blocks read is what it would plan from
the whole log, held in memory. Real files: rotated segments and a live log."""

from __future__ import annotations

from pathlib import Path

import pytest

from contemplation.models import MarkerKind, Metadata
from contemplation.prompt import budget, prompts, reach
from contemplation.protocol.logformat import marker
from contemplation.store.layout import Home
from contemplation.store.logview import LogView

META = Metadata(id="conv_20260101-100000_long", topic="long", created="", model="m")


def block(i: int, body: str) -> str:
    who = "CLAUDE -> OLLAMA" if i % 2 == 0 else "OLLAMA -> CLAUDE"
    return f"=== {who} [2026-01-01 10:{i // 60 % 60:02d}:{i % 60:02d}] ===\n{body}\n\n"


def body(i: int) -> str:
    if i % 6 == 2:  # a tool output the model has answered: a stub when room is short
        return (
            f"RESPONSE TO NEED: File contents of n{i - 1}.md\n=== BEGIN TOOL OUTPUT ===\n"
            + f"line {i} of the file\n" * (20 + i % 7)
            + "=== END TOOL OUTPUT ==="
        )
    words = " ".join(f"word{i}x{k}" for k in range(30 + (i * 7) % 50))
    return words + (f"\nNEED: File contents of n{i}.md" if i % 6 == 1 else "")


def write_log(folder: Path, blocks: int, per_file: int, summary_at: int | None) -> None:
    """``blocks`` blocks in files of ``per_file`` blocks (messages.N.log, the highest the
    oldest, then messages.log); a summary's NOTE lines after block ``summary_at``."""
    folder.mkdir(parents=True)
    files = [list(range(k, min(k + per_file, blocks))) for k in range(0, blocks, per_file)]
    for n, idx in enumerate(files):
        name = "messages.log" if n == len(files) - 1 else f"messages.{len(files) - 1 - n}.log"
        parts = []
        for i in idx:
            parts.append(block(i, body(i)))
            if i == summary_at:
                notes = budget.summary_notes("what came before, in short", 5)
                parts[-1] = (
                    parts[-1].rstrip("\n")
                    + "\n"
                    + "".join(marker(MarkerKind.NOTE, n) for n in notes)
                    + "\n"
                )
        text = "".join(parts)
        (folder / name).write_text(text)


def plans(folder: Path, window: int) -> tuple[budget.Plan, budget.Plan, int]:
    """The plan from the whole log held, and from the blocks :func:`reach` read back."""
    conv = Home(folder.parent.parent).conv(folder.name)
    full = LogView(conv, locked=True).refresh().blocks
    view = LogView(conv, locked=True, bare=True)
    blocks, first = reach.reach(view, view.refresh().blocks, window)
    out = []
    for bs, f in ((full, 0), (blocks, first)):
        request = prompts.build_request(META, bs[f:])
        out.append(budget.plan(request, window, blocks=bs, reserve=256, first=f))
    return out[0], out[1], first


@pytest.mark.parametrize("summary_at", [None, 30, 1150, 1190])
@pytest.mark.parametrize("window", [1024, 4096])
def test_the_plan_from_the_blocks_read_back_is_the_plan_from_the_whole_log(
    tmp_path: Path, window: int, summary_at: int | None
) -> None:
    """1,200 blocks in 24 files: the newest are read back, not all, and the request, its
    notes, what is summarised, the summary request and what it says are the same (a summary
    in the log before what is read, inside it, or recent enough to be reused)."""
    folder = tmp_path / "home" / "active" / META.id
    write_log(folder, 1200, 50, summary_at)
    whole, got, first = plans(folder, window)
    assert 0 < first < 1150, first  # a part only was read back
    if summary_at == 1190 and window == 4096:  # it covers enough: reused, no call
        assert not whole.summarise and "the summary above stands in" in whole.notes[-1]
        assert got == whole
        return
    if summary_at is not None:
        assert whole.previous == "what came before, in short"
    assert whole.summarise  # (its request is then the one it was given: see with_summary)
    assert got.notes == whole.notes
    assert (got.left_out, got.keep, got.previous) == (whole.left_out, whole.keep, whole.previous)
    assert got.summarised == len(whole.summarise) and got.summarise
    assert got.summarise == whole.summarise[len(whole.summarise) - len(got.summarise) :]
    assert budget.summary_request_for(got) == budget.summary_request_for(whole)
    assert got.with_summary("short") == whole.with_summary("short")
    assert got.without_summary("down") == whole.without_summary("down")


def test_a_short_log_is_read_whole(tmp_path: Path) -> None:
    """A log that the window can hold is read back whole: the same request."""
    folder = tmp_path / "home" / "active" / META.id
    write_log(folder, 12, 5, None)
    whole, got, first = plans(folder, 1 << 20)
    assert first == 0 and got == whole
