"""A person's file is a whole message whatever its name.

A follow-up (what was written into a message's file after the daemon took it, see
``release_claimed``) used to carry its bookkeeping in its name, ``<name>.rest@<N>``, and
the daemon trusted any inbox file of that shape: ``report.rest@100`` (shorter than 100
bytes) was deleted without a trace and ``draft.rest@21`` lost its first 21 bytes, after a
NOTE about a message that never existed. The offset now lives in a record the daemon writes
into ``processing/`` (a dot-name, keyed by the file's inode, with the hash of the bytes
already taken), so a name decides nothing.

In-process on real files (the pipeline's own burst), and the crash points of a follow-up's
own turn in a real daemon process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from contemplation.models import BlockKind, MarkerKind
from contemplation.protocol.logformat import marker
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store.layout import Conv, Home, Seen, read_message_seen
from contemplation.store.templates import load_template
from contemplation.writer import new_conversation
from contemplation.writer.folders import release_claimed
from tests.conftest import ROOT, base_env, run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama


@pytest.fixture
def conv(home: Home) -> Conv:
    return new_conversation(
        home, "names", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


def agent_texts(conv: Conv) -> list[str]:
    return [b.text for b in parse(conv.log.read_bytes()).blocks if b.kind is BlockKind.AGENT]


def notes(conv: Conv) -> list[str]:
    """The NOTE lines of the log (one before the first block is in no block's markers)."""
    head = marker(MarkerKind.NOTE, "x").split("x")[0]  # "=== NOTE: "
    return [line for line in conv.log.read_text().splitlines() if line.startswith(head)]


def nothing_left(conv: Conv) -> bool:
    """inbox/ and processing/ empty, dot-files (a follow-up's record) included."""
    return not list(conv.inbox.iterdir()) and (
        not conv.processing.exists() or not list(conv.processing.iterdir())
    )


def read(path: Path, offset: int = 0) -> Seen:
    _, _, seen = read_message_seen(path, 1 << 20, offset)
    assert seen is not None
    return seen


def a_follow_up(conv: Conv, first: str, taken: str, more: str) -> Path:
    """What the daemon leaves in inbox/ when ``first`` (its ``taken`` text read and its block
    committed) gained ``more`` before its release."""
    conv.processing.mkdir(exist_ok=True)
    path = conv.processing / f"00000000000000000001-abcdef-{first}"
    path.write_text(taken)
    seen = read(path)
    with open(path, "a") as f:
        f.write(more)
    rest = release_claimed(conv, path, seen, durable=False)
    assert rest is not None and rest.parent == conv.inbox
    return rest


# --------------------------------------------------------------------------- a person's names


@pytest.mark.parametrize("name", ["report.rest@100", "report.rest@13", "x.rest@0"])
def test_a_file_named_like_a_follow_up_past_its_end_is_a_whole_message_never_deleted(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings], name: str
) -> None:
    text = "short report\n"  # 13 bytes: at or before the offset its name claims
    (conv.inbox / name).write_text(text)
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == ["short report"]
    assert not any("rest of" in n for n in notes(conv)), notes(conv)
    assert not conv.failed.exists() and nothing_left(conv)


def test_a_file_named_like_a_follow_up_is_never_cut(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    text = "first line: 21 bytes\nthe second line of the draft\n"
    (conv.inbox / "draft.rest@21").write_text(text)
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == [text.rstrip("\n")]
    assert not any("rest of" in n for n in notes(conv)), notes(conv)
    assert fake_ollama.chat_requests()[-1]["messages"][-1]["content"] == text.rstrip("\n")
    assert nothing_left(conv)


def test_a_file_named_like_a_follow_up_that_grew_after_its_claim_is_queued_and_whole(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    # a person's file of that shape that really is written into after its claim: its own
    # follow-up, read from where the first read ended (not from the offset its name says)
    rest = a_follow_up(conv, "log.rest@3", "one two three\n", "four\n")
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == ["four"]
    assert any("the rest of log.rest@3" in n and "from 14 on" in n for n in notes(conv))
    assert not rest.exists() and nothing_left(conv)


# --------------------------------------------------------------------------- real follow-ups


def test_a_follow_up_is_taken_from_where_the_message_ended_after_a_note(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rest = a_follow_up(conv, "q.txt", "part one\n", "part two\n")
    assert rest.name == "q.txt.rest@9"
    assert [p.name for p in conv.processing.iterdir() if p.name.startswith(".")]  # its record
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == ["part two"]
    log = conv.log.read_text()
    assert log.index("the next message is the rest of q.txt") < log.index("part two")
    assert nothing_left(conv)  # the follow-up and its record gone with its commit


def test_a_follow_up_renamed_by_hand_is_still_a_follow_up_only_under_its_name(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    # its record names it: under another name it is a person's file, taken whole (the
    # bytes taken before come twice, never lost)
    rest = a_follow_up(conv, "q.txt", "part one\n", "part two\n")
    os.rename(rest, conv.inbox / "mine.txt")
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == ["part one\npart two"]
    assert nothing_left(conv)


def test_a_follow_up_rewritten_in_place_is_taken_whole(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    rest = a_follow_up(conv, "q.txt", "part one\n", "part two\n")
    with open(rest, "r+") as f:  # the same file (inode), its first bytes not those taken
        f.write("PART ONE\n")
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == ["PART ONE\npart two"]
    assert not any("rest of" in n for n in notes(conv))
    assert nothing_left(conv)


def test_a_record_for_another_file_is_not_trusted(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    # a follow-up's record left behind by a crash (its file gone): a person's later file
    # that took its name is whole, and the stale record goes with the next release
    rest = a_follow_up(conv, "q.txt", "part one\n", "part two\n")
    [record] = [p for p in conv.processing.iterdir() if p.name.startswith(".")]
    rest.unlink()
    mine = conv.inbox / "q.txt.rest@9"  # its name, and (as a file system may give) its inode
    mine.write_text("a new message of mine\n")
    record.rename(record.with_name(f".rest-{mine.stat().st_ino}"))
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == ["a new message of mine"]
    assert not any("rest of" in n for n in notes(conv))
    assert nothing_left(conv)


def test_a_file_rewritten_shorter_after_its_claim_is_queued_whole_after_a_note(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv.processing.mkdir(exist_ok=True)
    path = conv.processing / "00000000000000000001-abcdef-q.txt"
    path.write_text("a much longer first version\n")
    seen = read(path)
    path.write_text("short\n")
    assert release_claimed(conv, path, seen, durable=False) == conv.inbox / "q.txt.rest@0"
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == ["short"]
    assert any("the rest of q.txt" in n and "from 0 on" in n for n in notes(conv))
    assert nothing_left(conv)


def test_an_empty_follow_up_vanishes_with_its_record(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    conv.processing.mkdir(exist_ok=True)
    path = conv.processing / "00000000000000000001-abcdef-q.txt"
    path.write_text("hello\n")
    seen = read(path)
    with open(path, "a"):  # still held for writing at its release; nothing more comes
        rest = release_claimed(conv, path, seen, durable=False)
    assert rest == conv.inbox / "q.txt.rest@6"
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert agent_texts(conv) == [] and not conv.failed.exists()
    assert nothing_left(conv)


def test_a_follow_up_of_a_follow_up_keeps_the_first_name_and_the_whole_offset(
    conv: Conv,
) -> None:
    rest = a_follow_up(conv, "q.txt", "one\n", "two\n")
    claimed = conv.processing / f"00000000000000000002-fedcba-{rest.name}"
    os.rename(rest, claimed)
    seen = read(claimed, 4)
    with open(claimed, "a") as f:
        f.write("three\n")
    again = release_claimed(conv, claimed, seen, durable=False)
    assert again == conv.inbox / "q.txt.rest@8"
    assert read_message_seen(again, 1 << 20, 8)[0] == "three\n"
    records = [p for p in conv.processing.iterdir() if p.name.startswith(".")]
    assert len(records) == 1  # one record a file: the first one's was replaced


# --------------------------------------------------------------------------- crashes


def run_once(env: dict[str, str], crash: str | None = None) -> int:
    e = dict(env)
    if crash:
        e.update(CONTEMPLATION_TESTING="1", CONTEMPLATION_CRASH_AT=crash)
    return subprocess.run(
        [sys.executable, "-m", "contemplation", "run", "--once"],
        env=e,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    ).returncode


@pytest.mark.parametrize("point", ["claim", "intent", "append", "appended", "commit"])
def test_a_crash_in_a_follow_ups_turn_loses_nothing_and_duplicates_nothing(
    home: Home, conv: Conv, fake_ollama: FakeOllama, point: str
) -> None:
    env = base_env(home, fake_ollama)
    a_follow_up(conv, "q.txt", "part one\n", "part two\n")
    assert run_once(env, f"{point}:1") != 0  # killed there
    for _ in range(5):
        if run_once(env) == 0:
            break
    assert agent_texts(conv) == ["part two"]
    assert sum("the rest of q.txt" in n for n in notes(conv)) == 1
    assert nothing_left(conv)
