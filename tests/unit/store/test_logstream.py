"""A log read block by block: what :func:`logstream.stream` gives for a
real file, read a chunk at a time, is what one parse of the whole file gives, whatever the
chunk's size; a block longer than the bound is parsed from its first bytes, with its true end,
and the blocks after it are whole."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contemplation.models import Block, ParseResult
from contemplation.protocol import logformat
from contemplation.store import logstream
from contemplation.store.logstream import parse_segment
from tests.unit.examples import examples

H = logformat.header


def log_bytes() -> bytes:
    return (
        "=== CONTINUED from messages.1.log ===\n"
        + H("CLAUDE", "OLLAMA", "2026-01-19 10:00:00")
        + "What is a queue?\r\n ===  stuffed line\n\n"
        + H("OLLAMA", "CLAUDE", "2026-01-19 10:00:45")
        + "=== THINKING ===\nhmm\n=== END THINKING ===\nI need a file.\n"
        + "NEED: File contents of notes/todo.md\n\n"
        + H("CLAUDE", "OLLAMA", "2026-01-19 10:01:00")
        + "RESPONSE TO NEED: File contents of notes/todo.md\n(source: files)\nbody é ü\n\n"
        + H("OLLAMA", "CLAUDE", "2026-01-19 10:02:30")
        + "done\n=== COMPLETE ===\n"
    ).encode()


def streamed(path: Path, **kw: int) -> list[ParseResult]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return list(logstream.stream(fd, **kw))
    finally:
        os.close(fd)


def blocks(results: list[ParseResult]) -> list[Block]:
    return [b for r in results for b in r.blocks]


def same_as_whole(path: Path, **kw: int) -> None:
    data = path.read_bytes()
    whole = parse_segment(data)
    got = streamed(path, **kw)
    assert blocks(got) == list(whole.blocks)
    assert sum(r.size for r in got) == len(data)
    assert sorted(e for r in got for e in r.errors) == sorted(whole.errors)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_streamed_blocks_are_the_whole_parse_for_any_chunk(tmp_path: Path, chunk: int) -> None:
    path = tmp_path / "messages.log"
    path.write_bytes(log_bytes())
    same_as_whole(path, chunk=chunk)
    path.write_bytes(b"text before any header\n" + log_bytes()[38:] + b"tail with no newline")
    same_as_whole(path, chunk=chunk)
    path.write_bytes(log_bytes() + H("OLLAMA", "CLAUDE", "2026-01-19 10:03:00").encode()[:-1])
    same_as_whole(path, chunk=chunk)


@settings(max_examples=examples(60), deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(
            [
                H("CLAUDE", "OLLAMA", "2026-01-01 00:00:00"),
                H("OLLAMA", "CLAUDE", "2026-01-01 00:00:01"),
                "=== COMPLETE ===\n",
                "=== THINKING ===\n",
                "=== NOT A HEADER ===\n",
                "NEED: x\n",
                "plain words\n",
                "\n",
                "no newline",
                "=== CLAUDE -> OLLAMA [2026-01-01 00:00:02] ",
            ]
        ),
        max_size=30,
    ),
    chunk=st.integers(1, 200),
)
def test_streamed_is_whole_for_any_log(
    tmp_path_factory: pytest.TempPathFactory, parts: list[str], chunk: int
) -> None:
    path = tmp_path_factory.mktemp("log") / "messages.log"
    path.write_bytes("".join(parts).encode())
    same_as_whole(path, chunk=chunk)


def test_a_stream_can_start_at_a_header(tmp_path: Path) -> None:
    data = log_bytes()
    path = tmp_path / "messages.log"
    path.write_bytes(data)
    third = parse_segment(data).blocks[2]
    got = blocks(streamed(path, start=third.offset, chunk=5))
    assert got == list(parse_segment(data).blocks[2:])


def long_log(body_lines: int) -> tuple[bytes, int]:
    first = H("CLAUDE", "OLLAMA", "2026-01-01 00:00:00") + "short question\n\n"
    long = (
        H("OLLAMA", "CLAUDE", "2026-01-01 00:00:01")
        + "NEED: a thing\n"
        + ("a long line of the reply\n" * body_lines)
    )
    last = H("CLAUDE", "OLLAMA", "2026-01-01 00:00:02") + "RESPONSE TO NEED: a thing\nok\n"
    return (first + long + last).encode(), len((first + long).encode())


def test_a_block_past_the_bound_is_read_by_its_first_bytes_with_its_true_end(
    tmp_path: Path,
) -> None:
    data, long_end = long_log(2000)
    path = tmp_path / "messages.log"
    path.write_bytes(data)
    whole = parse_segment(data).blocks
    for chunk in (1, 64, 4096):
        got = streamed(path, chunk=chunk, max_block=1000)
        bs = blocks(got)
        assert len(bs) == 3
        assert bs[0] == whole[0] and bs[2] == whole[2]  # the blocks around it are whole
        cut = bs[1]
        assert (cut.offset, cut.end) == (whole[1].offset, whole[1].end) == (cut.offset, long_end)
        assert cut.needs == ("a thing",) and not cut.truncated
        assert whole[1].text.startswith(cut.text) and 900 < len(cut.text.encode()) <= 1000
        notes = [e for r in got for e in r.errors]
        assert len(notes) == 1, notes
        assert f"at byte {cut.offset} is {long_end - cut.offset} bytes" in notes[0]
        assert "bound is 1000 bytes" in notes[0]
        assert sum(r.size for r in got) == len(data)


def test_a_long_last_block_and_a_long_line_are_passed_over(tmp_path: Path) -> None:
    path = tmp_path / "messages.log"
    one_line = H("OLLAMA", "CLAUDE", "2026-01-01 00:00:01") + "x" * 5000  # still being written
    path.write_bytes(one_line.encode())
    for chunk in (3, 100, 10_000):
        got = streamed(path, chunk=chunk, max_block=1000)
        (b,) = blocks(got)
        assert b.end == len(one_line) and b.truncated
        assert len(b.text) <= 1000
        assert any("ends without a newline" in e for r in got for e in r.errors)
    then = one_line + "\n" + H("CLAUDE", "OLLAMA", "2026-01-01 00:00:02") + "next\n"
    path.write_bytes(then.encode())
    for chunk in (3, 100, 10_000):
        bs = blocks(streamed(path, chunk=chunk, max_block=1000))
        assert [b.text for b in bs][1:] == ["next"]
        assert bs[0].end == bs[1].offset == len(one_line) + 1


def test_memory_read_at_once_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every parse the stream makes covers at most the bound and a chunk of the file."""
    data, _ = long_log(20_000)
    path = tmp_path / "messages.log"
    path.write_bytes(data * 3)
    seen: list[int] = []
    real = logstream._parsed

    def spy(chunk: bytes, base: int, label: str) -> ParseResult:
        seen.append(len(chunk))
        return real(chunk, base, label)

    monkeypatch.setattr(logstream, "_parsed", spy)
    got = streamed(path, chunk=4096, max_block=10_000)
    assert max(seen) <= 10_000 + 4096
    assert len(blocks(got)) == 9
