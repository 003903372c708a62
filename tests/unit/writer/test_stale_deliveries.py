"""What a sender left in ``inbox/`` before its rename: a sender killed mid-write, or a power
cut after its temp file's fsync and before the rename was durable (the crash sweep's
``during:0:fsync:16:sync`` once left ``.<name>.msg.tmp`` in ``inbox/`` for good). The temp
name carries its writer's pid; recovery removes the ones whose writer is gone, keeps those a
live process may still be writing, and never touches a message."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contemplation.store.layout import Conv, Home, queued_messages
from contemplation.store.templates import load_template
from contemplation.writer import drop_message, new_conversation
from contemplation.writer.folders import remove_stale_deliveries


def _conv(home: Home) -> Conv:
    tpl = load_template(home, "default")
    return new_conversation(home, "c", template=tpl, model="m", backend="ollama", durable=False)


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_a_delivery_is_staged_under_a_name_that_names_its_writer(
    home: Home, monkeypatch: pytest.MonkeyPatch
) -> None:
    conv = _conv(home)
    seen: list[str] = []
    real = os.rename

    def rename(src: str | Path, dst: str | Path) -> None:
        seen.append(Path(src).name)
        real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    msg = drop_message(conv, "hello")
    assert len(seen) == 1 and seen[0].startswith(f".{msg.name}.tmp.{os.getpid()}.")


def test_what_a_gone_sender_left_is_removed_and_nothing_else(home: Home) -> None:
    conv = _conv(home)
    msg = drop_message(conv, "a message, delivered")
    dead, alive = _dead_pid(), os.getppid()
    left = conv.inbox / f".1-aa.msg.tmp.{dead}.abc123"
    left.write_text("half a messa")
    folder = conv.inbox / f".2-bb.msg.tmp.{dead}.def456"  # a message with files, staged
    folder.mkdir()
    (folder / "message.txt").write_text("x")
    writing = conv.inbox / f".3-cc.msg.tmp.{alive}.aaa111"  # its writer runs: kept
    writing.write_text("still being written")
    bare = conv.inbox / ".4-dd.msg.tmp"  # the old shape, no pid: kept while recent
    bare.write_text("old")
    stale_bare = conv.inbox / ".5-ee.msg.tmp"
    stale_bare.write_text("older")
    hour_ago = time.time() - 7200
    os.utime(stale_bare, (hour_ago, hour_ago))
    other = conv.inbox / ".hidden"  # someone else's dot-file
    other.write_text("not ours")

    gone = remove_stale_deliveries(conv)

    assert sorted(gone) == sorted([left.name, folder.name, stale_bare.name])
    assert sorted(p.name for p in conv.inbox.iterdir()) == sorted(
        [msg.name, writing.name, bare.name, other.name]
    )
    assert [p.name for p in queued_messages(conv)] == [msg.name]


def test_a_missing_inbox_is_nothing_to_remove(home: Home) -> None:
    conv = _conv(home)
    conv.inbox.rmdir()
    assert remove_stale_deliveries(conv) == []
