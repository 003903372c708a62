"""The daemon's claim of an inbox file: the file is linked into ``processing/``,
that folder made durable, and only then unlinked from ``inbox/``, so it always has a durable
name; a claim cut between the two leaves two names for one file, and recovery keeps the
claimed one only."""

from __future__ import annotations

import os

from contemplation.store.layout import Conv, Home
from contemplation.store.templates import load_template
from contemplation.writer import claim, drop_message, new_conversation
from contemplation.writer.attachments import drop_folder_message
from contemplation.writer.folders import drop_claimed_twins


def _conv(home: Home) -> Conv:
    tpl = load_template(home, "default")
    return new_conversation(home, "c", template=tpl, model="m", backend="ollama", durable=False)


def test_a_claimed_file_is_the_same_file_under_one_name(home: Home) -> None:
    conv = _conv(home)
    msg = drop_message(conv, "Which index?")
    ino = os.stat(msg).st_ino
    claimed = claim(conv, msg)
    assert claimed is not None and claimed.parent == conv.processing
    assert not msg.exists() and os.stat(claimed).st_ino == ino
    assert os.stat(claimed).st_nlink == 1
    assert claimed.name.endswith("-" + msg.name)


def test_a_claim_cut_between_its_link_and_its_unlink_is_taken_once(home: Home) -> None:
    conv = _conv(home)
    msg = drop_message(conv, "Which index?")
    twin = conv.processing / f"{0:020d}-abcdef-{msg.name}"
    os.link(msg, twin)  # what a claim killed at its point "claim_linked" leaves
    other = drop_message(conv, "another")
    assert drop_claimed_twins(conv) == [msg.name]
    assert sorted(p.name for p in conv.inbox.iterdir()) == [other.name]
    assert twin.read_text() == "Which index?" and os.stat(twin).st_nlink == 1
    assert drop_claimed_twins(conv) == []


def test_a_file_linked_in_twice_by_hand_is_two_messages(home: Home) -> None:
    """Only the claim's own twin goes (same inode and the claim's name for it): the same
    file put into inbox/ under two names by hand is sent twice, as it was before."""
    conv = _conv(home)
    first = drop_message(conv, "same words", name="q1.md")
    second = conv.inbox / "q2.md"
    os.link(first, second)
    claimed = claim(conv, first)
    assert claimed is not None and os.stat(claimed).st_nlink == 2  # shared with q2.md
    assert drop_claimed_twins(conv) == []
    assert second.exists()


def test_a_folder_message_is_claimed_whole_by_a_rename(home: Home) -> None:
    conv = _conv(home)
    msg = drop_folder_message(conv, "see attached", ())
    claimed = claim(conv, msg)
    assert claimed is not None and claimed.is_dir() and not msg.exists()
    assert list(conv.inbox.iterdir()) == []


def test_a_symlink_is_claimed_as_itself_not_its_target(home: Home) -> None:
    conv = _conv(home)
    target = home.root / "elsewhere.txt"
    target.write_text("not a message")
    link = conv.inbox / "link.msg"
    link.symlink_to(target)
    claimed = claim(conv, link)
    assert claimed is not None and claimed.is_symlink() and not os.path.lexists(link)
    assert os.stat(target).st_nlink == 1  # the target was never given another name
