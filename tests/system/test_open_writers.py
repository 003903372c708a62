"""The writer check and what the pipeline does with it, in-process on real files.

``being_written`` asks the kernel (a read lease on Linux, /proc where a lease is refused)
whether any process holds a file open for writing; real descriptors and a real child
process are the writers. Then the claim's two checks: a file opened for writing between the
look and the claim goes back to the inbox, and a claimed file that changed since it was read
is never removed with what it gained (it is queued as a follow-up).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contemplation.models import BlockKind
from contemplation.protocol.parser import parse
from contemplation.settings import Settings
from contemplation.store import openfiles
from contemplation.store.layout import Conv, Home, Seen, processing_entries, read_message_seen
from contemplation.store.openfiles import being_written, being_written_in, proc_says
from contemplation.store.templates import load_template
from contemplation.writer import claim, new_conversation
from contemplation.writer.folders import release_claimed
from tests.conftest import run_burst, runtime_for
from tests.fakes.ollama_server import FakeOllama

pytestmark = pytest.mark.skipif(not openfiles.LINUX, reason="the kernel's answer is Linux's")


@pytest.fixture
def conv(home: Home) -> Conv:
    return new_conversation(
        home, "writers", template=load_template(home, "default"), model="llama3.2", backend="ollama"
    )


@pytest.fixture
def child_writer(tmp_path: Path) -> Iterator[Callable[[Path], subprocess.Popen[str]]]:
    """Another process that opens a file for appending, says so, and holds it until stdin
    closes."""
    procs: list[subprocess.Popen[str]] = []

    def start(path: Path) -> subprocess.Popen[str]:
        code = (
            "import sys\n"
            f"f = open({str(path)!r}, 'a')\n"
            "print('open', flush=True)\n"
            "sys.stdin.read()\n"
        )
        p = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(p)
        assert p.stdout is not None and p.stdout.readline() == "open\n"
        return p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def blocks(conv: Conv) -> list[tuple[BlockKind, str]]:
    return [(b.kind, b.text) for b in parse(conv.log.read_bytes()).blocks]


def test_a_file_open_for_writing_is_being_written_until_closed(tmp_path: Path) -> None:
    path = tmp_path / "m.txt"
    with open(path, "w") as f:
        f.write("half")
        assert being_written(path) is True
        with open(path) as reader:  # a reader is no writer
            reader.read()
            assert being_written(path) is True
    assert being_written(path) is False
    with open(path):
        assert being_written(path) is False


def test_another_process_writing_is_seen_and_its_exit_ends_it(
    tmp_path: Path, child_writer: Callable[[Path], subprocess.Popen[str]]
) -> None:
    path = tmp_path / "m.txt"
    path.write_text("x")
    writer = child_writer(path)
    assert being_written(path) is True
    st = path.stat()
    assert proc_says(st.st_dev, st.st_ino) is True  # the fallback finds it too
    writer.communicate("")  # stdin closed: it exits, and its descriptor with it
    assert being_written(path) is False
    assert proc_says(st.st_dev, st.st_ino) is False


def test_what_cannot_be_a_message_file_has_no_answer(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    os.mkfifo(tmp_path / "fifo")
    assert being_written(tmp_path / "link") is None  # never followed
    assert being_written(tmp_path / "fifo") is None  # never blocks
    assert being_written(tmp_path) is None
    assert being_written(tmp_path / "gone") is None


def test_the_proc_fallback_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "m.txt"
    with open(path, "w"):
        st = path.stat()
        assert proc_says(st.st_dev, st.st_ino) is True
        assert proc_says(st.st_dev, st.st_ino, limit=0) is None  # too many to look at: unknown


def test_a_writer_opening_while_the_lease_is_held_does_not_end_this_process(
    tmp_path: Path,
) -> None:
    # a lease broken by an opener signals its holder; SIGIO (the default) would kill us
    path = tmp_path / "m.txt"
    path.write_text("x")
    stop = threading.Event()

    def opener() -> None:
        while not stop.is_set():
            os.close(os.open(path, os.O_WRONLY))

    t = threading.Thread(target=opener)
    t.start()
    try:
        answers = {being_written(path) for _ in range(3000)}
    finally:
        stop.set()
        t.join()
    assert answers <= {True, False}


def test_status_names_the_inbox_files_still_being_written(conv: Conv) -> None:
    (conv.inbox / "done.txt").write_text("finished\n")
    with open(conv.inbox / "typing.txt", "w") as f:
        f.write("so far")
        assert being_written_in(conv) == ["typing.txt"]
    assert being_written_in(conv) == []


def test_a_file_opened_for_writing_after_the_look_goes_back_to_the_inbox(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    # the claim happened between the check and a writer's open: the claimed file is held
    (conv.inbox / "q.txt").write_text("part one\n")
    claimed = claim(conv, conv.inbox / "q.txt")
    assert claimed is not None
    rt = runtime_for(make_settings(fake_ollama))
    with open(claimed, "a") as f:
        run_burst(rt)
        assert [p.name for p in conv.inbox.iterdir()] == ["q.txt"]  # as it came
        assert not processing_entries(conv) and blocks(conv) == []
        f.write("part two\n")
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert blocks(conv)[0] == (BlockKind.AGENT, "part one\npart two")


def read(path: Path) -> Seen:
    _, _, seen = read_message_seen(path, 1 << 20)
    assert seen is not None
    return seen


def test_a_claimed_file_as_it_was_read_is_removed(conv: Conv) -> None:
    path = conv.processing / "01-ab-q.txt"
    path.write_text("hello\n")
    assert release_claimed(conv, path, read(path), durable=False) is None
    assert not path.exists() and not list(conv.inbox.iterdir())


def test_what_a_claimed_file_gained_after_its_read_is_queued_never_dropped(conv: Conv) -> None:
    path = conv.processing / "01-ab-q.txt"
    path.write_text("hello\n")
    seen = read(path)
    with open(path, "a") as f:
        f.write("more\n")
    rest = release_claimed(conv, path, seen, durable=False)
    assert rest == conv.inbox / "q.txt.rest@6" and not path.exists()
    assert read_message_seen(rest, 1 << 20, 6)[0] == "more\n"
    # rewritten shorter: queued whole
    path.write_text("a much longer first version\n")
    seen = read(path)
    path.write_text("short\n")
    assert release_claimed(conv, path, seen, durable=False) == conv.inbox / "q.txt.rest@0"


def test_a_claimed_file_still_held_for_writing_is_queued_and_an_empty_rest_vanishes(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    path = conv.processing / "01-ab-q.txt"
    path.write_text("hello\n")
    seen = read(path)
    with open(path, "a"):
        rest = release_claimed(conv, path, seen, durable=False)
    assert rest == conv.inbox / "q.txt.rest@6"  # nothing more came: the follow-up is empty
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert not list(conv.inbox.iterdir()) and not processing_entries(conv)
    assert blocks(conv) == [] and not conv.failed.exists()


def test_a_follow_up_is_taken_from_where_the_message_ended_after_a_note(
    conv: Conv, fake_ollama: FakeOllama, make_settings: Callable[..., Settings]
) -> None:
    # put back by the daemon (its record in processing/ says from which byte): a file
    # dropped by hand under such a name is a whole message (tests/system/test_follow_up_names)
    path = conv.processing / "01-ab-q.txt"
    path.write_text("part one\n")
    seen = read(path)
    with open(path, "a") as f:
        f.write("part two\n")
    assert release_claimed(conv, path, seen, durable=False) == conv.inbox / "q.txt.rest@9"
    run_burst(runtime_for(make_settings(fake_ollama)))
    assert blocks(conv)[0] == (BlockKind.AGENT, "part two")
    log = conv.log.read_text()
    assert log.index("the next message is the rest of q.txt") < log.index("part two")
    assert not list(conv.inbox.iterdir()) and not list(conv.processing.iterdir())
