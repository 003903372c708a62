"""``Obsidian notes matching``: ranked search over a real folder of Markdown notes."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from contemplation.errors import ToolError
from contemplation.needs.tools.base import Unconfigured
from contemplation.needs.tools.notes import NotesSearch


@pytest.fixture
def vault(tmp_path: Path) -> Path:
    v = tmp_path / "vault"
    (v / "projects").mkdir(parents=True)
    (v / ".obsidian").mkdir()
    (v / "projects" / "caching.md").write_text(
        "# Caching strategy\n\nWe cache query results in Redis.\n"
        "Cache invalidation happens on write; the TTL is five minutes.\n"
    )
    (v / "daily.md").write_text(
        "# Monday\n\nLunch, then a long talk about many things. Redis came up once.\n"
    )
    (v / "memory-design.md").write_text(
        "Notes on memory persistence: snapshots every hour, query patterns logged.\n"
    )
    (v / ".obsidian" / "workspace.md").write_text("# Caching caching caching redis\n")
    (v / "ignored.txt").write_text("caching redis caching")
    return v


def test_ranked_hits_have_titles_paths_and_snippets(vault: Path) -> None:
    hits, total = NotesSearch(vault).search("redis caching")
    assert total == 3  # hidden folders and non-Markdown files are not notes
    assert [h.path for h in hits] == ["projects/caching.md", "daily.md"]
    first = hits[0]
    assert first.title == "Caching strategy"
    assert "Redis" in first.snippet
    assert hits[0].score > hits[1].score


def test_a_title_match_outranks_a_body_mention(vault: Path) -> None:
    (vault / "redis.md").write_text("# Redis\n\nThe in-memory store we run.\n")
    hits, _ = NotesSearch(vault).search("redis")
    assert hits[0].path == "redis.md"


def test_file_name_is_the_title_without_a_heading(vault: Path) -> None:
    hits, _ = NotesSearch(vault).search("memory persistence")
    assert hits[0].title == "memory-design"
    assert "persistence" in hits[0].snippet


def test_changed_notes_are_reindexed(vault: Path) -> None:
    search = NotesSearch(vault)
    assert search.search("kubernetes")[0] == []
    note = vault / "daily.md"
    note.write_text("# Monday\n\nKubernetes upgrade planned.\n")
    st = note.stat()
    os.utime(note, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    hits, _ = search.search("kubernetes")
    assert [h.path for h in hits] == ["daily.md"]


def test_links_out_of_the_vault_are_ignored(vault: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.md"
    secret.write_text("# Zanzibar\nprivate")
    (vault / "leak.md").symlink_to(secret)
    (vault / "same.md").symlink_to(vault / "projects" / "caching.md")  # the same note again
    (vault / "raw").mkdir()
    (vault / "raw" / "draft.txt").write_text("# Draft\nzanzibar is the codename")
    (vault / "draft.md").symlink_to(vault / "raw" / "draft.txt")  # a link that stays inside
    hits, total = NotesSearch(vault).search("zanzibar")
    assert [h.path for h in hits] == ["raw/draft.txt"]
    assert "private" not in " ".join(h.snippet for h in hits)
    assert total == 4  # three notes + the inside link; the outside link and the dup are not


def test_answer_text_and_limits(vault: Path) -> None:
    for i in range(12):
        (vault / f"redis-{i}.md").write_text(f"# Redis note {i}\nredis")
    search = NotesSearch(vault, results=3)
    result = asyncio.run(search.call({"query": "redis"}))
    assert result.text.startswith("3 of the notes that match 'redis' (15 notes searched):")
    assert result.text.count("\n1. ") == 1 and "\n4. " not in result.text
    assert result.source == str(vault)
    nothing = search.answer("zebra crossing")
    assert nothing.text == "no notes match 'zebra crossing' (15 notes searched)"


def test_no_vault_configured_or_missing(tmp_path: Path) -> None:
    with pytest.raises(Unconfigured, match="no notes vault is available") as unset:
        NotesSearch(None).search("x")
    assert "notes_vault" in unset.value.hint and "notes_vault" not in str(unset.value)
    with pytest.raises(ToolError, match="does not exist"):
        NotesSearch(tmp_path / "nope").search("x")
    with pytest.raises(ToolError, match="missing argument 'query'"):
        asyncio.run(NotesSearch(tmp_path).call({"query": "  "}))


def test_a_note_over_the_size_bound_is_searched_whole_by_streaming(vault: Path) -> None:
    """A vault of 4 with one note twice the size bound (the bound lowered to 64 KiB: the
    default 1 MiB made this a 2 MiB note searched three times): 4 are searched (not 3), a word
    in its head and a word in its last line are both found, the snippet is the line that holds
    it, and nothing is said to be left out."""
    big = vault / "journal.md"
    big.write_text(
        "# Journal\nthe zebra crossing\n"
        + "filler words here\n" * 8_000
        + "at the very end a unicorn appeared\n"
    )
    assert big.stat().st_size > 2 * 64 * 1024
    tool = NotesSearch(vault, max_note_bytes=64 * 1024)
    found = tool.answer("zebra")
    assert "(4 notes searched)" in found.text and "journal.md" in found.text
    assert found.note == ""
    tail = tool.answer("unicorn")
    assert tail.text == (
        "1 of the notes that match 'unicorn' (4 notes searched):\n"
        "1. Journal (journal.md)\n   at the very end a unicorn appeared"
    )
    assert tail.note == ""
    assert tool.answer("dragon").text == "no notes match 'dragon' (4 notes searched)"


def test_a_note_over_the_scan_bound_is_searched_in_part_and_named(vault: Path) -> None:
    big = vault / "huge.md"
    big.write_text("# Huge\nthe zebra crossing\n" + "filler words here\n" * 10_000 + "unicorn\n")
    size = big.stat().st_size
    tool = NotesSearch(vault, max_note_bytes=1024, max_scan_bytes=64 * 1024)
    out = tool.answer("unicorn")
    assert out.text == "no notes match 'unicorn' (4 notes searched)"
    assert (
        out.note
        == f"1 note was searched in part only: huge.md (its first 65,536 of {size:,} bytes)"
    )
    assert "huge.md" in tool.answer("zebra").text


def test_large_notes_past_one_searchs_read_bound_are_read_by_the_next_search(
    vault: Path,
) -> None:
    """One search reads at most ``max_scan_total`` bytes of large notes: the rest are searched
    in their head and named, and a later search reads them whole."""
    for name in ("a-big.md", "b-big.md"):
        (vault / name).write_text(f"# {name}\n" + "filler words here\n" * 2_000 + "unicorn\n")
    tool = NotesSearch(vault, max_note_bytes=1024, max_scan_total=40_000)
    first = tool.answer("unicorn")
    assert first.text.startswith("1 of the notes that match 'unicorn' (5 notes searched):")
    assert first.note.startswith("1 note was searched in part only: b-big.md (its first 1,024 of")
    second = tool.answer("unicorn")
    assert second.text.startswith("2 of the notes that match 'unicorn' (5 notes searched):")
    assert second.note == ""


def test_a_note_that_cannot_be_read_is_named(vault: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (vault / "locked.md").write_text("# Locked\nredis\n")
    real_open = os.open

    def open_(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        if str(path).endswith("locked.md"):  # as a file of another user would be, even to root
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", open_)
    out = NotesSearch(vault).answer("redis")
    assert "(3 notes searched)" in out.text
    assert out.note == "1 note could not be read: locked.md"
    (vault / "projects" / "locked.md").write_text("redis\n")
    two = NotesSearch(vault).answer("redis")
    assert two.note == "2 notes could not be read: locked.md, projects/locked.md"


def test_notes_past_the_count_bound_are_said(vault: Path) -> None:
    out = NotesSearch(vault, max_notes=2).answer("redis")
    assert "1 note(s) past the first 2 were not searched" in out.note
